package telemetry_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb/telemetry"
)

// TestFieldSetString: a FieldSet printed as a bare number (fmt's %v of a
// uint32: 8352 for {running,kv_cache_usage,asleep}) left the reader to
// work out its bits; it lists the fields by name.
func TestFieldSetString(t *testing.T) {
	for _, tc := range []struct {
		s    telemetry.FieldSet
		want string
	}{
		{0, "{}"},
		{1 << telemetry.Waiting, "{waiting}"},
		{1<<telemetry.Asleep | 1<<telemetry.KVCacheUsage | 1<<telemetry.Running, "{running,kv_cache_usage,asleep}"},
		{telemetry.ProcessLoad, "{gpu_mem_used_bytes,running,waiting,kv_cache_usage,prefix_cache_hit_rate,cpu_util,app_util,lora_slots,asleep}"},
		{1<<telemetry.GPUMemUsed | 1<<20 | 1<<31, "{gpu_mem_used_bytes,Field(20),Field(31)}"},
	} {
		assert.Equal(t, tc.want, fmt.Sprintf("%v", tc.s))
		assert.Equal(t, tc.want, fmt.Sprint(tc.s))
	}
	assert.Equal(t, "160", fmt.Sprintf("%d", telemetry.FieldSet(1<<telemetry.Running|1<<telemetry.KVCacheUsage)), "%d still prints the bits")
}

// TestSampleString: a Sample printed with fmt showed Has as a number and
// its whole array of values, meaningful or not ("{2026-01-01
// 00:00:00.0000005 +0000 UTC 225 [7.9691776e+10 0 0 80 0 3 0 0.95 0 0 0 0
// 0 0] <nil>}" below: the 80 is no reading), so a reader could not tell
// a 0 reading from none, nor which slot was which field. It shows the time and each field it carries by name,
// also inside a struct that holds it by value, as balancer.EndpointStats
// does.
func TestSampleString(t *testing.T) {
	assert.Equal(t, "{}", fmt.Sprint(telemetry.Sample{}))

	s := telemetry.Sample{Time: time.Date(2026, 1, 1, 0, 0, 0, 500, time.UTC)}
	s.Set(telemetry.Running, 3)
	s.Set(telemetry.Waiting, 0)
	s.Set(telemetry.KVCacheUsage, 0.95)
	s.Set(telemetry.GPUMemUsed, 76000*(1<<20))
	s.Values[telemetry.GPUTemp] = 80 // not in Has: means nothing
	want := "{time=2026-01-01T00:00:00.0000005Z gpu_mem_used_bytes=7.9691776e+10 running=3 waiting=0 kv_cache_usage=0.95}"
	assert.Equal(t, want, fmt.Sprint(s))
	assert.Equal(t, want, fmt.Sprintf("%v", s))
	assert.Equal(t, want, fmt.Sprintf("%v", &s))
	assert.Equal(t, "{EndpointID:a Sample:"+want+"}", fmt.Sprintf("%+v", telemetry.Observation{EndpointID: "a", Sample: s}))

	var l telemetry.Sample // no time
	l.SetAdapters(2, &telemetry.Adapters{Base: "llama", Running: []string{"sql"}})
	l.Has |= 1 << 20
	assert.Equal(t, `{lora_slots=2 Field(20) adapters={base="llama" running=["sql"] waiting=[]}}`, fmt.Sprint(l))
}
