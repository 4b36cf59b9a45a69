package dcgm

import (
	"slices"
	"sort"
	"time"

	"github.com/inferlb/inferlb/telemetry"
)

// Mapping returns the IDs of the endpoints a GPU serves; nil means none (a
// GPU of another workload). It must be safe to call from the goroutine that
// runs Collect while other goroutines change what it reads, if they do.
type Mapping func(g *GPU) []string

// ByHost maps every GPU of a host to the endpoints on that host. hostOf maps
// endpoint ID to host name as dcgm-exporter reports it (its Hostname or
// hostname label: in Kubernetes the node name where the exporter's
// DaemonSet passes it in, as the GPU Operator's does; an exporter left to
// its own host name reports its pod's name, which matches no endpoint's
// host: check one scrape's labels, or use ByPod). Several endpoints on one
// host each take the worst GPU of the host, a conservative reading when the
// host's GPUs are split between them; use ByPod for an exact one.
func ByHost(hostOf map[string]string) Mapping {
	byHost := map[string][]string{}
	for id, host := range hostOf {
		byHost[host] = append(byHost[host], id)
	}
	for _, ids := range byHost {
		sort.Strings(ids)
	}
	return func(g *GPU) []string { return byHost[g.Host] }
}

// Pod names a Kubernetes pod.
type Pod struct{ Namespace, Name string }

// ByPod maps a GPU to the endpoints served by the pod it is attributed to
// (dcgm-exporter with --kubernetes adds pod and namespace labels to the
// series of a GPU allocated to a pod; pod_name and pod_namespace with
// --use-old-namespace; exported_pod and exported_namespace through a
// Prometheus /federate endpoint that renamed them: see GPU.Pod). podOf
// maps endpoint ID to pod. GPUs not attributed to a listed pod map to
// nothing.
func ByPod(podOf map[string]Pod) Mapping {
	byPod := map[Pod][]string{}
	for id, p := range podOf {
		byPod[p] = append(byPod[p], id)
	}
	for _, ids := range byPod {
		sort.Strings(ids)
	}
	return func(g *GPU) []string {
		if g.Pod == "" {
			return nil
		}
		return byPod[Pod{Namespace: g.Namespace, Name: g.Pod}]
	}
}

// Aggregate folds GPUs into one observation per endpoint, in order of first
// appearance. An endpoint served by several GPUs takes the worst of them:
// GPUMemUsed and GPUMemTotal from the GPU with the highest memory pressure
// (so the pair stays consistent), and the highest utilization, temperature
// and power. An endpoint one of whose GPUs reports memory without a valid
// reading (a memory gauge in its Dropped set, or FB_USED without FB_FREE
// or the reverse) gets no GPUMemUsed or GPUMemTotal: the GPU it cannot read
// may be its fullest, and its other GPUs' figures would say it has room it
// may not have. Likewise an endpoint one of whose GPUs has its utilization,
// temperature or power gauge dropped gets none of that field: the largest
// of its other GPUs' may be below the one it could not read. A GPU with no
// series at all is not known to be missing (a
// Mapping does not say how many GPUs an endpoint has): the endpoint reads
// the GPUs it has. A sample's Time is the oldest of its GPUs' Times when
// every one with a value read has one, else zero.
func Aggregate(gpus []GPU, m Mapping) []telemetry.Observation {
	if m == nil {
		return nil
	}
	return aggregate(gpus, func(int) Mapping { return m })
}

// aggregate is Aggregate with a Mapping per GPU: mapOf(i) maps gpus[i]
// (Source gives each GPU its exporter's Mapping).
func aggregate(gpus []GPU, mapOf func(i int) Mapping) []telemetry.Observation {
	var out []telemetry.Observation
	at := map[string]int{}
	pressure := map[string]float64{}
	memUnknown := map[string]bool{} // endpoints with a GPU whose memory is unreadable
	// endpoints with a GPU whose utilization, temperature or power gauge
	// was dropped: the others' largest may understate it
	unknown := map[string]telemetry.FieldSet{}
	untimed := map[string]bool{} // endpoints with a GPU without a Time
	for i := range gpus {
		g := &gpus[i]
		ids := mapOf(i)(g)
		if len(ids) == 0 {
			continue
		}
		gs := g.Sample()
		p, hasP := g.MemPressure()
		const memory = 1<<FBUsed | 1<<FBFree | 1<<FBReserved
		unreadable := g.Dropped&memory != 0 || (g.Has&memory != 0 && !hasP)
		var lost telemetry.FieldSet
		for _, d := range [...]struct {
			m Metric
			f telemetry.Field
		}{{Util, telemetry.GPUUtil}, {Temp, telemetry.GPUTemp}, {Power, telemetry.GPUPower}} {
			if g.Dropped.Has(d.m) {
				lost |= 1 << d.f
			}
		}
		for _, id := range ids {
			j, seen := at[id]
			if !seen {
				j = len(out)
				at[id] = j
				out = append(out, telemetry.Observation{EndpointID: id})
			}
			s := &out[j].Sample
			switch {
			case untimed[id]:
			case g.Has == 0: // every value dropped: no time to go by
			case g.Time.IsZero():
				untimed[id] = true
				s.Time = time.Time{}
			case s.Time.IsZero() || g.Time.Before(s.Time):
				s.Time = g.Time
			}
			if unreadable {
				memUnknown[id] = true
			}
			if lost != 0 {
				unknown[id] |= lost
			}
			if hasP {
				if prev, ok := pressure[id]; !ok || p > prev {
					pressure[id] = p
					used, _ := gs.Get(telemetry.GPUMemUsed)
					total, _ := gs.Get(telemetry.GPUMemTotal)
					s.Set(telemetry.GPUMemUsed, used)
					s.Set(telemetry.GPUMemTotal, total)
				}
			}
			for _, f := range []telemetry.Field{telemetry.GPUUtil, telemetry.GPUTemp, telemetry.GPUPower} {
				if v, ok := gs.Get(f); ok {
					if cur, had := s.Get(f); !had || v > cur {
						s.Set(f, v)
					}
				}
			}
		}
	}
	for i := range out {
		s := &out[i].Sample
		if memUnknown[out[i].EndpointID] {
			s.Has &^= 1<<telemetry.GPUMemUsed | 1<<telemetry.GPUMemTotal
			s.Values[telemetry.GPUMemUsed], s.Values[telemetry.GPUMemTotal] = 0, 0
		}
		for _, f := range []telemetry.Field{telemetry.GPUUtil, telemetry.GPUTemp, telemetry.GPUPower} {
			if unknown[out[i].EndpointID].Has(f) {
				s.Has &^= 1 << f
				s.Values[f] = 0
			}
		}
	}
	// An endpoint left with nothing (its one GPU's memory unreadable) has
	// no observation: the Store keeps its last reading until it ages out.
	return slices.DeleteFunc(out, func(o telemetry.Observation) bool { return o.Sample.Empty() })
}
