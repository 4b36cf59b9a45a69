package promapi_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/promapi"
)

// A LoRASlots series is read from its labels: the latest (largest valued)
// per endpoint, its base model required, its lists emptied where the
// server's count says nothing runs (or waits) any more.
func TestCollectLoRA(t *testing.T) {
	body := `{"status":"success","data":{"resultType":"vector","result":[
 {"metric":{"instance":"a","inferlb_field":"lora_slots","max_lora":"2","running_lora_adapters":"chat","waiting_lora_adapters":"","model_name":"llama"},"value":[1767225600,"1764931207"]},
 {"metric":{"instance":"a","inferlb_field":"lora_slots","max_lora":"2","running_lora_adapters":"sql,chat","waiting_lora_adapters":"law","model_name":"llama"},"value":[1767225600,"1764931211"]},
 {"metric":{"instance":"a","inferlb_field":"running","model_name":"llama"},"value":[1767225600,"3"]},
 {"metric":{"instance":"b","inferlb_field":"lora_slots","max_lora":"1","running_lora_adapters":"sql","waiting_lora_adapters":"law","model_name":"llama"},"value":[1767225600,"1764931211"]},
 {"metric":{"instance":"b","inferlb_field":"running"},"value":[1767225600,"0"]},
 {"metric":{"instance":"b","inferlb_field":"waiting"},"value":[1767225600,"2"]},
 {"metric":{"instance":"c","inferlb_field":"lora_slots","max_lora":"0","model_name":"llama"},"value":[1767225600,"1764931211"]},
 {"metric":{"instance":"c","inferlb_field":"running"},"value":[1767225600,"1"]},
 {"metric":{"instance":"d","inferlb_field":"lora_slots","max_lora":"4"},"value":[1767225600,"1764931211"]},
 {"metric":{"instance":"d","inferlb_field":"running"},"value":[1767225600,"1"]}
]}}`
	obs, err := fakeProm(t, 200, body, nil).Collect(t.Context())
	require.ErrorIs(t, err, telemetry.ErrPartial)
	assert.Contains(t, err.Error(), "2 series skipped; first: lora_slots for c: max_lora \"0\" is not a slot count")
	by := map[string]telemetry.Sample{}
	for _, o := range obs {
		by[o.EndpointID] = o.Sample
	}
	require.Len(t, by, 4)
	assert.Equal(t, map[string]float64{"running": 3, "lora_slots": 2}, fields(by["a"]))
	assert.Equal(t, &telemetry.Adapters{Base: "llama", Running: []string{"sql", "chat"}, Waiting: []string{"law"}}, by["a"].Adapters, "the latest state")
	assert.Equal(t, &telemetry.Adapters{Base: "llama", Waiting: []string{"law"}}, by["b"].Adapters, "nothing runs: the running list is stale")
	for _, id := range []string{"c", "d"} {
		assert.Nil(t, by[id].Adapters, id)
		assert.Equal(t, map[string]float64{"running": 1}, fields(by[id]), id)
	}
}

// A LoRASlots series that is skipped (its labels give no state) makes no
// observation for an endpoint that has no other series. One was made
// before the series was found bad, with no field and no time: the Poller
// skipped it and counted it a second time, and it took one of
// MaxEndpoints places, so that an answer of such series for as many
// endpoints crowded out every good one after them.
func TestCollectBadLoRAAloneMakesNoObservation(t *testing.T) {
	const bad = `{"metric":{"instance":"c%d","inferlb_field":"lora_slots","max_lora":"0","model_name":"llama"},"value":[1767225600,"1764931211"]},`
	const good = `{"metric":{"instance":"b","inferlb_field":"waiting"},"value":[1767225600,"2"]}`
	for _, n := range []int{1, promapi.MaxEndpoints} {
		var b strings.Builder
		b.WriteString(`{"status":"success","data":{"resultType":"vector","result":[`)
		for i := range n {
			fmt.Fprintf(&b, bad, i)
		}
		b.WriteString(good + `]}}`)
		obs, err := fakeProm(t, 200, b.String(), nil).Collect(t.Context())
		require.ErrorIs(t, err, telemetry.ErrPartial, n)
		assert.Contains(t, err.Error(), fmt.Sprintf("%d series skipped; first: lora_slots for c0: max_lora \"0\" is not a slot count", n))
		require.Len(t, obs, 1, n)
		assert.Equal(t, "b", obs[0].EndpointID, n)
		assert.Equal(t, map[string]float64{"waiting": 2}, fields(obs[0].Sample), n)
	}
}

// A LoRA reading measured at another time than the endpoint's other
// fields moves to an observation of its own with its adapters.
func TestCollectLoRAStampedApart(t *testing.T) {
	body := `{"status":"success","data":{"resultType":"vector","result":[
 {"metric":{"instance":"a","inferlb_field":"lora_slots","max_lora":"1","running_lora_adapters":"sql","waiting_lora_adapters":"","model_name":"llama"},"value":[1767225600,"1764931211"]},
 {"metric":{"instance":"a","inferlb_field":"running"},"value":[1767225600,"3"]},
 {"metric":{"instance":"a","inferlb_time":"running"},"value":[1767225600,"1767225599"]},
 {"metric":{"instance":"a","inferlb_time":"lora_slots"},"value":[1767225600,"1767225590"]}
]}}`
	src := fakeProm(t, 200, body, nil)
	src.Queries = map[telemetry.Field]string{telemetry.Running: "r", telemetry.LoRASlots: "l"}
	src.Timestamps = map[telemetry.Field]string{telemetry.Running: "tr", telemetry.LoRASlots: "tl"}
	obs, err := src.Collect(t.Context())
	require.NoError(t, err)
	require.Len(t, obs, 2)
	assert.Equal(t, map[string]float64{"running": 3}, fields(obs[0].Sample))
	assert.Nil(t, obs[0].Sample.Adapters)
	assert.True(t, obs[0].Sample.Time.Equal(time.Unix(1767225599, 0)))
	assert.Equal(t, map[string]float64{"lora_slots": 1}, fields(obs[1].Sample))
	assert.Equal(t, &telemetry.Adapters{Base: "llama", Running: []string{"sql"}}, obs[1].Sample.Adapters)
	assert.True(t, obs[1].Sample.Time.Equal(time.Unix(1767225590, 0)))
}
