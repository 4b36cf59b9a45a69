// Package telemetry carries load and health signals from outside the request
// path (NVIDIA DCGM, model-server /metrics, Prometheus, ORCA and vLLM load
// reports) to the balancer: a Sample per endpoint, Sources that produce them and
// a Store that keeps the latest value of every field with its age. Fields
// are numbers in fixed units; the one that is not, a server's LoRA
// adapters in use (Sample.Adapters), travels with its LoRASlots field.
//
// Telemetry is advisory. A missing or stale field is neutral for routing, and
// malformed input is dropped and counted, never fatal.
package telemetry

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
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
	// CPUUtil and AppUtil are ORCA's cpu_utilization and
	// application_utilization: 1 is fully used, and more (an
	// overcommitted server) is kept, as ORCA allows it (gRFC A51;
	// grpc-go's ServerMetricsRecorder accepts any value >= 0).
	CPUUtil
	AppUtil
	// LoRASlots is how many distinct LoRA adapters the server runs in one
	// batch (vLLM's --max-loras). A sample that carries it carries
	// Sample.Adapters too (see SetAdapters).
	LoRASlots
	// KVCachePreallocated is 1 for a server that reserves its KV cache
	// (most of its GPU memory) when it starts, and so holds that memory
	// whatever its load, though it may report no KV-cache usage: TGI
	// (--cuda-memory-fraction; it never reports one), llama.cpp's
	// llama-server (its whole --ctx-size; newer builds report no usage),
	// Triton's vLLM and TensorRT-LLM backends. Its GPU memory then never prices it
	// (MemoryPressure), as a KV-cache usage reading keeps it from pricing
	// the servers that report one. 1 is its only value: Set refuses any
	// other.
	KVCachePreallocated
	// Asleep is 1 for a server put to sleep (vLLM's --enable-sleep-mode,
	// POST /sleep): its weights are offloaded or discarded and it serves
	// nothing until it is woken (POST /wake_up). It reports no load while
	// it sleeps (vLLM lets a server sleep only once its requests are
	// done), so without this field it reads as the most idle endpoint of
	// the fleet. 0 says the server is awake: unlike KVCachePreallocated,
	// Asleep takes 0 as well as 1, so the reading after a wake-up
	// replaces the one that said asleep. Set refuses any other value.
	Asleep

	// NumFields is the number of fields; a Sample holds one slot for each.
	NumFields = int(Asleep) + 1
)

var fieldNames = [NumFields]string{
	"gpu_mem_used_bytes", "gpu_mem_total_bytes", "gpu_util", "gpu_temp_c", "gpu_power_w",
	"running", "waiting", "kv_cache_usage", "prefix_cache_hit_rate", "cpu_util", "app_util",
	"lora_slots", "kv_cache_preallocated", "asleep",
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

// ProcessLoad is the fields that describe the load of the server process
// (its queue, its KV and prefix cache, its utilization, the GPU memory it
// holds, the LoRA adapters it has loaded), rather than its hardware (GPU
// memory size, utilization, temperature, power): what a restart empties,
// and so what a balancer expires (Store.Expire) when an endpoint may have
// restarted. KVCachePreallocated is not in it: a restarted server
// pre-allocates as before. Asleep is: a server starts awake, so a
// reading that said asleep describes the old process.
const ProcessLoad = FieldSet(1<<Running | 1<<Waiting | 1<<KVCacheUsage | 1<<PrefixCacheHitRate |
	1<<CPUUtil | 1<<AppUtil | 1<<GPUMemUsed | 1<<LoRASlots | 1<<Asleep)

// Has reports whether f is in the set.
func (s FieldSet) Has(f Field) bool { return s&(1<<f) != 0 }

// String lists the set's fields by name, in Field order:
// "{running,kv_cache_usage}" ("{}" for none). A bit past the last field
// is listed as Field.String names it ("Field(20)").
func (s FieldSet) String() string {
	b := []byte{'{'}
	for f := range Field(32) {
		if s.Has(f) {
			if len(b) > 1 {
				b = append(b, ',')
			}
			b = append(b, f.String()...)
		}
	}
	return string(append(b, '}'))
}

// Sample is one observation of an endpoint. Only the fields in Has are
// meaningful; the zero Sample carries nothing.
type Sample struct {
	// Time is when the values were observed (not when they were received).
	Time   time.Time
	Has    FieldSet
	Values [NumFields]float64
	// Adapters names the LoRA adapters the server has requests of, when
	// the LoRASlots field is present (SetAdapters sets both); a Store
	// keeps it with that field, and drops it with it when it goes stale.
	// It is shared, never copied: treat it as read-only.
	Adapters *Adapters
}

// Adapters is a server's LoRA adapters in use, as vLLM reports them in
// vllm:lora_requests_info: the adapters of the requests in its running
// batch and of those waiting. Running holds at most LoRASlots distinct
// adapters; a request for another one waits until every running request
// of some adapter has finished (vLLM's scheduler skips it meanwhile),
// while requests for the base model never wait for a slot. An Adapters is
// immutable once published: sources build a new one for each sample.
type Adapters struct {
	// Base is the server's base model (vLLM's model_name label): a request
	// for it uses no adapter.
	Base string
	// Running and Waiting name the adapters with requests running and
	// waiting; sources keep at most MaxAdapterNames of each (AdapterNames),
	// and a Store keeps no more, nor empty or longer names, whatever a Source
	// publishes.
	Running, Waiting []string
}

// IsBase reports whether model names a's base model, which uses no
// adapter: Base itself, or a version of it named base@version, as of
// Base's own name (llama@v2 beside llama, or beside llama@v1). vLLM serves
// its base model under every --served-model-name it is given and reports
// the first: started with `--served-model-name llama llama@v2`, as a
// canary serving a version's name beside the stable one is, it reports
// llama, and calls for llama@v2 were taken for a LoRA adapter's (sent to
// one adapter home, or passed over where every slot was taken). So an
// adapter's name must not start with its base model's name and an @.
func (a *Adapters) IsBase(model string) bool {
	return model == a.Base || modelStem(model) == modelStem(a.Base)
}

// modelStem is name up to its first '@' (all of it without one).
func modelStem(name string) string {
	if i := strings.IndexByte(name, '@'); i >= 0 {
		return name[:i]
	}
	return name
}

// MaxAdapterNames bounds the names an Adapters list holds, and
// MaxAdapterNameLen the bytes of one name: a source drops the rest (a
// server cannot run more adapters in one batch than that in any
// deployment seen, adapter names are short, and a scrape is untrusted
// input that a picker reads for every candidate).
const (
	MaxAdapterNames   = 64
	MaxAdapterNameLen = 256
)

// AdapterNames splits a comma-separated list of adapter names, as vLLM
// writes them in a label, into an Adapters list: empty names and names
// longer than MaxAdapterNameLen are left out, and at most MaxAdapterNames
// kept. Sources that read vllm:lora_requests_info use it.
func AdapterNames(list string) []string {
	var out []string
	for n := range strings.SplitSeq(list, ",") {
		if n = strings.TrimSpace(n); adapterName(n) && len(out) < MaxAdapterNames {
			out = append(out, n)
		}
	}
	return out
}

// adapterName reports whether n is kept in an Adapters list: not empty,
// and at most MaxAdapterNameLen bytes (AdapterNames, and the Store for
// lists a Source made itself).
func adapterName(n string) bool { return n != "" && len(n) <= MaxAdapterNameLen }

// SlotWait reports how a request for model would find the server's LoRA
// slots: adapter says model is an adapter (not the base model) that no
// request runs there, so serving it takes a slot; full says every slot is
// taken by other adapters, so the request would wait for one. An adapter
// whose requests wait there while every slot is taken by others is held
// there too, not about to run: full. One whose requests wait while a
// slot is free is about to run (they wait for a place in the batch, not
// for a slot): neither. Both are false without LoRA telemetry (the
// LoRASlots field and Adapters), for an empty model and for the base
// model.
func (s *Sample) SlotWait(model string) (adapter, full bool) {
	a := s.Adapters
	slots, ok := s.Get(LoRASlots)
	if !ok || !(slots >= 1) || a == nil || model == "" || a.IsBase(model) || slices.Contains(a.Running, model) {
		return false, false
	}
	if float64(len(a.Running)) >= slots {
		return true, true
	}
	return !slices.Contains(a.Waiting, model), false
}

// SetAdapters stores a server's LoRA slots and adapters in use (see
// Adapters). A slot count below 1, NaN or infinite, or a nil a, is
// rejected and leaves the sample as it was; SetAdapters reports whether
// they were kept.
func (s *Sample) SetAdapters(slots float64, a *Adapters) bool {
	if a == nil || !(slots >= 1) || math.IsInf(slots, 0) {
		return false
	}
	s.Set(LoRASlots, slots)
	s.Adapters = a
	return true
}

// MaxRequests bounds a Running or Waiting count: no server runs or queues
// a million requests. A larger count is a broken reading (a counter read
// as a gauge, a total summed over time), which, taken as it came, would
// price its endpoint out of rotation until it aged out.
const MaxRequests = 1 << 20

// Set stores v for f. NaN, infinities, a Running or Waiting count above
// MaxRequests, a KVCachePreallocated other than 1 and an Asleep other
// than 0 or 1 are rejected (the
// field stays absent) so a bad exposition can never poison a score; Set
// reports whether v was kept.
func (s *Sample) Set(f Field, v float64) bool {
	if int(f) >= NumFields || !admissible(f, v) {
		return false
	}
	s.Values[f] = v
	s.Has |= 1 << f
	return true
}

// admissible reports whether Set keeps v for f, a known field: a finite
// value, for Running and Waiting at most MaxRequests, for
// KVCachePreallocated 1, and for Asleep 0 or 1. A Store applies the same test to the Values a
// Sample was handed by hand.
func admissible(f Field, v float64) bool {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return false
	case f == Running || f == Waiting:
		return v <= MaxRequests
	case f == KVCachePreallocated:
		return v == 1
	case f == Asleep:
		return v == 0 || v == 1
	}
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
// a server that reports no KV-cache usage and is not known to pre-allocate
// its KV cache (KVCachePreallocated). Engines that report one (vLLM,
// SGLang, TensorRT-LLM) allocate their KV cache once at start, up to a
// configured share of the GPU (vLLM's gpu_memory_utilization, 0.9 by
// default and often 0.95; SGLang's mem_fraction_static), so the memory
// they hold is their configuration, not their load: two idle replicas
// started at 0.90 and 0.95 would differ several-fold in a memory price,
// and replicas at 0.95 by a few points of noise. Their KV-cache usage is
// their memory pressure. TGI, llama.cpp, and Triton's vLLM and TensorRT-LLM
// backends, pre-allocate so too but may report no KV-cache usage: their
// source says so with KVCachePreallocated. Servers that allocate as they
// go (Triton's other backends, custom servers) report neither, and their
// GPU memory does follow load. A Slot's LoadInto leaves GPU memory out
// while the KV-cache usage or KVCachePreallocated it holds is stale, so
// a server that reported either is never priced by its memory.
func (s *Sample) MemoryPressure() (float64, bool) {
	if s.Has.Has(KVCacheUsage) || s.Has.Has(KVCachePreallocated) {
		return 0, false
	}
	return s.MemoryUsage()
}

// String formats the sample for people: its time (RFC 3339, left out when
// zero), then each field it carries as name=value, in Field order, and
// its Adapters when it has any, as in
// "{time=2026-01-01T00:00:00Z running=3 kv_cache_usage=0.95}". Values of
// fields not in Has are left out: they mean nothing. It has a value
// receiver so that fmt finds it in a Sample held by value (as
// balancer.EndpointStats.Telemetry is); nothing on a pick's path calls
// it.
func (s Sample) String() string {
	var b []byte
	sep := func() {
		if len(b) > 0 {
			b = append(b, ' ')
		}
	}
	if !s.Time.IsZero() {
		b = append(b, "time="...)
		b = s.Time.AppendFormat(b, time.RFC3339Nano)
	}
	for f := range Field(32) {
		if !s.Has.Has(f) {
			continue
		}
		sep()
		b = append(b, f.String()...)
		if int(f) < NumFields {
			b = append(b, '=')
			b = strconv.AppendFloat(b, s.Values[f], 'g', -1, 64)
		}
	}
	if a := s.Adapters; a != nil {
		sep()
		b = fmt.Appendf(b, "adapters={base=%q running=%q waiting=%q}", a.Base, a.Running, a.Waiting)
	}
	return "{" + string(b) + "}"
}

// Empty reports whether the sample carries no field.
func (s *Sample) Empty() bool { return s.Has == 0 }
