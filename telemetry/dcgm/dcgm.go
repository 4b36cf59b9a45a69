// Package dcgm reads NVIDIA GPU telemetry from dcgm-exporter's Prometheus
// endpoint (default :9400/metrics) and maps GPUs to the endpoints they serve.
//
// ParseMetrics turns one exposition into a GPU record per GPU (per MIG
// instance, per attributed container). A Mapping says which endpoint IDs a
// GPU serves: by host name (ByHost), by Kubernetes pod (ByPod) or by any
// function. Aggregate folds GPUs into one Sample per endpoint, taking the
// worst GPU: an endpoint whose model spans several GPUs runs out of memory
// when its fullest GPU does, so GPUMemUsed and GPUMemTotal come from the GPU
// with the highest memory pressure (none, when one of its GPUs exports a
// memory value that had to be dropped: that GPU may be the fullest), and
// utilization, temperature and power are the highest among its GPUs.
// Source scrapes exporters and does both;
// like modelserver.Source, it reads its Targets (each an exporter's URL and
// the Mapping of its GPUs) once per round, so the exporters it scrapes can
// follow the nodes as they join and leave (one dcgm-exporter DaemonSet pod
// per node in Kubernetes).
//
// An exposition whose samples carry timestamps (a Prometheus /federate
// endpoint, a caching sidecar) says when its values were measured: a GPU
// whose every value has one takes the oldest as its Time, and so does an
// endpoint whose every GPU has one (a telemetry.Poller reads one ahead of
// its clock as now). Otherwise times are zero, for the caller (a telemetry.Poller)
// to stamp.
//
// dcgm-exporter has no total-memory metric: total is FB_FREE + FB_USED +
// FB_RESERVED (MiB; 1.x exporters, without FB_RESERVED, FB_FREE + FB_USED). GPUMemUsed is total - FB_FREE (used plus reserved:
// whatever a new allocation cannot have).
//
// The LLM scorer prices GPU memory only for endpoints that report no
// KV-cache usage and are not marked as pre-allocating one
// (telemetry.Sample.MemoryPressure): vLLM, SGLang and TensorRT-LLM, TGI,
// llama.cpp, and Triton's vLLM and TensorRT-LLM backends hold their configured share
// of GPU memory whatever their load. For those, scrape the model server
// too (modelserver, which reads the KV-cache usage or marks the server
// with telemetry.KVCachePreallocated); DCGM's memory still reaches
// metrics and the Store.
package dcgm

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/internal/promtext"
)

// Metric names one dcgm-exporter gauge a GPU record carries.
type Metric uint8

// The gauges read, with their dcgm-exporter names. dcgm-exporter 1.x's
// names (dcgm_fb_used, dcgm_fb_free, dcgm_gpu_utilization, dcgm_gpu_temp,
// dcgm_power_usage, dcgm_xid_errors) are read too, in the same units; the
// current name wins where an exposition has both.
const (
	FBUsed     Metric = iota // DCGM_FI_DEV_FB_USED, MiB
	FBFree                   // DCGM_FI_DEV_FB_FREE, MiB
	FBReserved               // DCGM_FI_DEV_FB_RESERVED, MiB
	Util                     // DCGM_FI_DEV_GPU_UTIL (%), or DCGM_FI_PROF_GR_ENGINE_ACTIVE (ratio) on MIG
	Temp                     // DCGM_FI_DEV_GPU_TEMP, °C
	Power                    // DCGM_FI_DEV_POWER_USAGE, W
	XIDErrors                // DCGM_FI_DEV_XID_ERRORS, the last XID error code (0: none)
)

// MetricSet is a set of Metrics.
type MetricSet uint16

// Has reports whether m is in the set.
func (s MetricSet) Has(m Metric) bool { return s&(1<<m) != 0 }

// GPU is one GPU (or MIG instance) as dcgm-exporter reports it.
type GPU struct {
	UUID        string // UUID label (uuid with --use-old-namespace)
	Index       int    // gpu label; -1 if absent
	Device      string // device label, e.g. nvidia0
	PCIBusID    string
	ModelName   string // modelName label, e.g. "NVIDIA H100 80GB HBM3"
	Host        string // Hostname label (hostname in newer exporters)
	MIGProfile  string // GPU_I_PROFILE, e.g. "1g.10gb"; empty without MIG
	MIGInstance string // GPU_I_ID; empty without MIG
	// Pod, Namespace and Container are set with --kubernetes, from the pod,
	// namespace and container labels (pod_name, pod_namespace and
	// container_name with --use-old-namespace; exported_pod,
	// exported_namespace and exported_container, when present, from a
	// Prometheus /federate endpoint whose server renamed the exporter's
	// labels to keep its own target labels, which name the exporter's pod).
	Pod       string
	Namespace string
	Container string

	FBUsedMiB, FBFreeMiB, FBReservedMiB float64
	UtilPercent                         float64 // 0..100
	TempC                               float64
	PowerW                              float64
	XIDError                            float64 // last XID error code
	Has                                 MetricSet
	// Dropped holds the gauges whose series was exported for this record
	// but whose value was dropped: NaN, infinite or out of range. A GPU
	// with a memory gauge dropped has no memory reading Aggregate can
	// trust, and withholds its endpoints' (see Aggregate).
	Dropped MetricSet
	// Time is when the values were measured, from the exposition's own
	// sample timestamps when every value read for the GPU carries one (a
	// Prometheus /federate endpoint, a caching sidecar): the oldest of
	// them. Zero otherwise: the exposition was measured when served.
	Time time.Time
}

// MemTotalMiB returns FB_FREE + FB_USED + FB_RESERVED (reserved counts as 0
// when an older exporter does not report it), and false without used and free.
func (g *GPU) MemTotalMiB() (float64, bool) {
	if !g.Has.Has(FBUsed) || !g.Has.Has(FBFree) {
		return 0, false
	}
	t := g.FBUsedMiB + g.FBFreeMiB + g.FBReservedMiB
	return t, t > 0
}

// MemPressure returns (total - free) / total in 0..1.
func (g *GPU) MemPressure() (float64, bool) {
	total, ok := g.MemTotalMiB()
	if !ok {
		return 0, false
	}
	return min(max((total-g.FBFreeMiB)/total, 0), 1), true
}

const mib = 1 << 20

// Sample converts g to telemetry units: bytes, utilization 0..1, °C, W. Its
// Time is g's.
func (g *GPU) Sample() telemetry.Sample {
	s := telemetry.Sample{Time: g.Time}
	if total, ok := g.MemTotalMiB(); ok {
		s.Set(telemetry.GPUMemTotal, total*mib)
		s.Set(telemetry.GPUMemUsed, (total-g.FBFreeMiB)*mib)
	}
	if g.Has.Has(Util) {
		s.Set(telemetry.GPUUtil, g.UtilPercent/100)
	}
	if g.Has.Has(Temp) {
		s.Set(telemetry.GPUTemp, g.TempC)
	}
	if g.Has.Has(Power) {
		s.Set(telemetry.GPUPower, g.PowerW)
	}
	return s
}

// family describes how one dcgm-exporter metric fills a GPU.
type family struct {
	name   string
	metric Metric
	scale  float64 // multiply to get the GPU field's unit
	lo, hi float64 // valid range after scaling
}

var families = [...]family{
	{"DCGM_FI_DEV_FB_USED", FBUsed, 1, 0, 1 << 40},
	{"DCGM_FI_DEV_FB_FREE", FBFree, 1, 0, 1 << 40},
	{"DCGM_FI_DEV_FB_RESERVED", FBReserved, 1, 0, 1 << 40},
	{"DCGM_FI_DEV_GPU_UTIL", Util, 1, 0, 100},
	// MIG instances have no GPU_UTIL; graphics-engine activity is a 0..1 ratio.
	{"DCGM_FI_PROF_GR_ENGINE_ACTIVE", Util, 100, 0, 100},
	{"DCGM_FI_DEV_GPU_TEMP", Temp, 1, -100, 200},
	{"DCGM_FI_DEV_POWER_USAGE", Power, 1, 0, 1e5},
	{"DCGM_FI_DEV_XID_ERRORS", XIDErrors, 1, 0, 1e9},
	// dcgm-exporter 1.x (NVIDIA/gpu-monitoring-tools: its dcgmi dmon
	// script, and pod-gpu-metrics-exporter on :9400 in Kubernetes) named
	// the same fields dcgm_*, in the same units. Listed after the current
	// names, which win where an exposition has both.
	{"dcgm_fb_used", FBUsed, 1, 0, 1 << 40},
	{"dcgm_fb_free", FBFree, 1, 0, 1 << 40},
	{"dcgm_gpu_utilization", Util, 1, 0, 100},
	{"dcgm_gpu_temp", Temp, 1, -100, 200},
	{"dcgm_power_usage", Power, 1, 0, 1e5},
	{"dcgm_xid_errors", XIDErrors, 1, 0, 1e9},
}

// ErrNoGPUs is returned for an exposition without any GPU metric this
// package reads (a wrong URL, or an exporter with those collectors off).
var ErrNoGPUs = errors.New("dcgm: no DCGM GPU metrics found")

// key identifies one record: a GPU or MIG instance as attributed to one
// container. Attribution is part of the key so a GPU time-sliced between
// pods yields one record per pod, which ByPod needs.
type key struct {
	host, id, mig, ns, pod, container string
}

// ParseMetrics reads a dcgm-exporter text exposition and returns one GPU per
// GPU or MIG instance (and attributed container), sorted by host, index and
// MIG instance.
//
// Only the series of the gauges above are parsed into objects, and at most
// 8192 of them: the rest of an exposition costs a scan, so a wrong URL
// with a million series of something else costs about its body. With the
// default counters a GPU has 8 such series, so one exposition covers at
// most 1024 GPUs: a Prometheus /federate endpoint serving a larger fleet
// is read in part (scrape the exporters, or query with package promapi).
// Malformed lines of those gauges and series past the limit are skipped, and values
// out of range (negative memory, utilization above 100%) are dropped, and
// so are repeats of a gauge for one GPU record (a series exported twice, or
// GPUs whose series lack the UUID, gpu and device labels, which nothing
// tells apart): the first series counts, valid or not. A dropped value is
// in its GPU's Dropped set, and a GPU whose every value was dropped is
// still returned (with an empty Has), so Aggregate can tell its endpoint's
// reading is incomplete. Any of these returns the GPUs read so far with an
// error wrapping telemetry.ErrPartial. An exposition with no GPU metric, or
// none valid, returns ErrNoGPUs. ParseMetrics never panics.
func ParseMetrics(r io.Reader) ([]GPU, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("dcgm: reading exposition: %w", err)
	}
	return parseBytes(data)
}

// read holds the names of families: the only metrics parsed into objects.
var read = func() map[string]bool {
	m := make(map[string]bool, len(families))
	for _, f := range families {
		m[f.name] = true
	}
	return m
}()

func parseBytes(data []byte) ([]GPU, error) {
	fams, skipped, perr := promtext.ParseSelected(data, func(name []byte) bool { return read[string(name)] })
	byKey := map[key]*GPU{}
	untimed := map[*GPU]bool{} // GPUs with a value read that carries no timestamp
	// taken holds, per GPU, the families (bit i: families[i]) a series
	// has been met for. Another series of one on the same record (a
	// series exported twice, or GPUs without UUID, gpu and device labels,
	// which nothing tells apart) is a rival reading, not a newer one: the first
	// is kept, as Prometheus and modelserver keep it, and the rest are
	// dropped and counted. Read last-value-wins, an idle GPU's figures
	// hid a full one, and FB_USED of one GPU met FB_FREE of another.
	taken := map[*GPU]uint32{}
	bad := 0
	var firstBad string
	for i, f := range families {
		fam, ok := fams[f.name]
		if !ok {
			continue
		}
		for _, m := range fam.Metric {
			g := record(byKey, m)
			if taken[g]&(1<<i) != 0 {
				bad++
				if firstBad == "" {
					firstBad = fmt.Sprintf("duplicate series of %s for GPU %q", f.name, cmp.Or(g.UUID, g.Device, g.Host))
				}
				continue
			}
			taken[g] |= 1 << i
			raw, ok := promtext.Value(m)
			v := raw * f.scale
			if !ok || v < f.lo || v > f.hi {
				bad++
				if !g.Has.Has(f.metric) {
					g.Dropped |= 1 << f.metric
				}
				if firstBad == "" {
					if !ok {
						raw = promtext.RawValue(m) // NaN or an infinity, as exported
					}
					firstBad = fmt.Sprintf("%s=%g for GPU %q", f.name, raw, cmp.Or(g.UUID, g.Device, g.Host))
				}
				continue
			}
			if g.Has.Has(f.metric) {
				// Read under another name listed first: GPU_UTIL wins
				// over engine activity, a current name over a 1.x one.
				continue
			}
			g.set(f.metric, v)
			switch at := time.UnixMilli(m.GetTimestampMs()); {
			case m.TimestampMs == nil:
				untimed[g] = true
			case g.Time.IsZero() || at.Before(g.Time):
				g.Time = at
			}
		}
	}
	gpus := make([]GPU, 0, len(byKey))
	read := 0 // records with a value read
	for _, g := range byKey {
		if untimed[g] {
			g.Time = time.Time{}
		}
		// A record whose every value was dropped stays: the endpoint it
		// serves must not read its other GPUs as all of it.
		if g.Has != 0 || g.Dropped != 0 {
			gpus = append(gpus, *g)
		}
		if g.Has != 0 {
			read++
		}
	}
	if read == 0 {
		gpus = gpus[:0]
	}
	slices.SortFunc(gpus, func(a, b GPU) int {
		return cmp.Or(cmp.Compare(a.Host, b.Host), cmp.Compare(a.Index, b.Index), cmp.Compare(a.UUID, b.UUID),
			cmp.Compare(a.Device, b.Device), cmp.Compare(a.MIGInstance, b.MIGInstance), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Pod, b.Pod),
			cmp.Compare(a.Container, b.Container))
	})
	switch {
	case len(gpus) == 0 && perr != nil:
		return nil, fmt.Errorf("%w (%d exposition lines skipped: %v)", ErrNoGPUs, skipped, perr)
	case len(gpus) == 0 && bad > 0:
		return nil, fmt.Errorf("%w (%d values dropped (out of range or duplicate), first %s)", ErrNoGPUs, bad, firstBad)
	case len(gpus) == 0:
		return nil, ErrNoGPUs
	case perr != nil:
		return gpus, fmt.Errorf("%w: dcgm: exposition partly read (%d lines skipped): %v", telemetry.ErrPartial, skipped, perr)
	case bad > 0:
		return gpus, fmt.Errorf("%w: dcgm: %d values dropped (out of range or duplicate), first %s", telemetry.ErrPartial, bad, firstBad)
	}
	return gpus, nil
}

// record returns the GPU for m's labels, creating it.
func record(byKey map[key]*GPU, m *dto.Metric) *GPU {
	l := func(name string) string { return promtext.Label(m, name) }
	// --use-old-namespace (dcgm-exporter's 1.x names) writes uuid, and
	// pod_name, pod_namespace and container_name for the pod labels.
	uuid := cmp.Or(l("UUID"), l("uuid"))
	// The GPU: its UUID, else its index, else its device (nvidia0): series
	// relabelled without UUID and gpu still tell GPUs apart by device.
	id := uuid
	switch gpu, dev := l("gpu"), l("device"); {
	case id != "":
	case gpu != "" || dev == "":
		id = "gpu:" + gpu
	default:
		id = "device:" + dev
	}
	// A Prometheus server that scraped the exporter without honor_labels
	// (a ServiceMonitor's default) kept its own target labels pod,
	// namespace and container, naming the exporter's pod, and renamed the
	// exporter's to exported_pod, exported_namespace and
	// exported_container: served again by its /federate endpoint, those
	// name the pod the GPU is allocated to.
	k := key{
		host:      cmp.Or(l("Hostname"), l("hostname")),
		id:        id,
		mig:       l("GPU_I_ID"),
		ns:        cmp.Or(l("exported_namespace"), l("namespace"), l("pod_namespace")),
		pod:       cmp.Or(l("exported_pod"), l("pod"), l("pod_name")),
		container: cmp.Or(l("exported_container"), l("container"), l("container_name")),
	}
	if g, ok := byKey[k]; ok {
		return g
	}
	idx, err := strconv.Atoi(l("gpu"))
	if err != nil {
		idx = -1
	}
	g := &GPU{
		UUID: uuid, Index: idx, Device: l("device"), PCIBusID: l("pci_bus_id"), ModelName: l("modelName"),
		Host: k.host, MIGProfile: l("GPU_I_PROFILE"), MIGInstance: k.mig,
		Pod: k.pod, Namespace: k.ns, Container: k.container,
	}
	byKey[k] = g
	return g
}

func (g *GPU) set(m Metric, v float64) {
	switch m {
	case FBUsed:
		g.FBUsedMiB = v
	case FBFree:
		g.FBFreeMiB = v
	case FBReserved:
		g.FBReservedMiB = v
	case Util:
		g.UtilPercent = v
	case Temp:
		g.TempC = v
	case Power:
		g.PowerW = v
	case XIDErrors:
		g.XIDError = v
	}
	g.Has |= 1 << m
	g.Dropped &^= 1 << m // another name's value was dropped; this one counts
}
