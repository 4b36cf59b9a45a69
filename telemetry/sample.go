// Package telemetry carries load and health signals from outside the request
// path (NVIDIA DCGM, model-server /metrics, Prometheus, ORCA and vLLM load
// reports) to the balancer: a Sample per endpoint, Sources that produce them and
// a Store that keeps the latest value of every field with its age.
//
// Telemetry is advisory. A missing or stale field is neutral for routing, and
// malformed input is dropped and counted, never fatal.
package telemetry

import (
	"fmt"
	"math"
	"time"
)

// Field names one signal in a Sample.
type Field uint8

// The fields a Sample can carry. Units are fixed so sources agree.
const (
	GPUMemUsed         Field = iota // GPU framebuffer in use, bytes (worst GPU of the endpoint)
	GPUMemTotal                     // GPU framebuffer size, bytes (same GPU as GPUMemUsed)
	GPUUtil                         // GPU utilization, 0..1
	GPUTemp                         // GPU temperature, degrees Celsius
	GPUPower                        // GPU power draw, watts
	Running                         // requests the server is executing now
	Waiting                         // requests queued on the server
	KVCacheUsage                    // fraction of KV-cache blocks in use, 0..1
	PrefixCacheHitRate              // prefix-cache hit rate, 0..1
	CPUUtil                         // ORCA cpu_utilization, 0..1
	AppUtil                         // ORCA application_utilization, 0..1

	// NumFields is the number of fields; a Sample holds one slot for each.
	NumFields = int(AppUtil) + 1
)

var fieldNames = [NumFields]string{
	"gpu_mem_used_bytes", "gpu_mem_total_bytes", "gpu_util", "gpu_temp_c", "gpu_power_w",
	"running", "waiting", "kv_cache_usage", "prefix_cache_hit_rate", "cpu_util", "app_util",
}

// String returns the field's snake_case name.
func (f Field) String() string {
	if int(f) < NumFields {
		return fieldNames[f]
	}
	return fmt.Sprintf("Field(%d)", uint8(f))
}

// ParseField maps a name returned by Field.String back to the Field.
func ParseField(name string) (Field, bool) {
	for i, n := range fieldNames {
		if n == name {
			return Field(i), true
		}
	}
	return 0, false
}

// FieldSet is a set of Fields, one bit each.
type FieldSet uint32

// Has reports whether f is in the set.
func (s FieldSet) Has(f Field) bool { return s&(1<<f) != 0 }

// Sample is one observation of an endpoint. Only the fields in Has are
// meaningful; the zero Sample carries nothing.
type Sample struct {
	// Time is when the values were observed (not when they were received).
	Time   time.Time
	Has    FieldSet
	Values [NumFields]float64
}

// Set stores v for f. NaN and infinities are rejected (the field stays
// absent) so a bad exposition can never poison a score; Set reports whether v was kept.
func (s *Sample) Set(f Field, v float64) bool {
	if int(f) >= NumFields || math.IsNaN(v) || math.IsInf(v, 0) {
		return false
	}
	s.Values[f] = v
	s.Has |= 1 << f
	return true
}

// Get returns f's value and whether it is present.
func (s *Sample) Get(f Field) (float64, bool) {
	if int(f) >= NumFields || !s.Has.Has(f) {
		return 0, false
	}
	return s.Values[f], true
}

// MemoryUsage returns GPU memory used / total in 0..1, when both are present
// and total is positive.
func (s *Sample) MemoryUsage() (float64, bool) {
	used, ok1 := s.Get(GPUMemUsed)
	total, ok2 := s.Get(GPUMemTotal)
	if !ok1 || !ok2 || total <= 0 {
		return 0, false
	}
	return min(max(used/total, 0), 1), true
}

// MemoryPressure returns GPU memory used / total as a load signal: only for
// a server that reports no KV-cache usage. Engines that do (vLLM, SGLang,
// TensorRT-LLM) allocate their KV cache once at start, up to a configured
// share of the GPU (vLLM's gpu_memory_utilization, 0.9 by default and often
// 0.95; SGLang's mem_fraction_static), so the memory they hold is their
// configuration, not their load: two idle replicas started at 0.90 and
// 0.95 would differ several-fold in a memory price, and replicas at 0.95
// by a few points of noise. Their KV-cache usage is their memory pressure.
// Servers that allocate as they go (many Triton backends, custom servers)
// report no KV cache, and their GPU memory does follow load.
func (s *Sample) MemoryPressure() (float64, bool) {
	if s.Has.Has(KVCacheUsage) {
		return 0, false
	}
	return s.MemoryUsage()
}

// Empty reports whether the sample carries no field.
func (s *Sample) Empty() bool { return s.Has == 0 }
