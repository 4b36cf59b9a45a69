package fleetsim

import (
	"slices"
	"time"
)

// LoRAResult is what the replicas' adapter slots (ServerParams.MaxLoRAs)
// did to a run's measured calls. Latencies are in seconds.
type LoRAResult struct {
	// AdapterCalls are the measured calls that named a LoRA adapter
	// (completed or unfinished at the end; failed calls are left out);
	// SlotWaited of them were skipped at least once by a scheduler for
	// want of an adapter slot.
	AdapterCalls int `json:"adapter_calls"`
	SlotWaited   int `json:"slot_waited"`
	// SlotWaitMean and SlotWaitP99 are the time an adapter call spent
	// waiting for a slot, from the step that first skipped it to the one
	// that found its adapter running or a slot free, over every adapter
	// call (0 for those that never waited); SlotWaitTotal sums it.
	SlotWaitMean  float64 `json:"slot_wait_mean_s"`
	SlotWaitP99   float64 `json:"slot_wait_p99_s"`
	SlotWaitTotal float64 `json:"slot_wait_total_s"`
	// Loads counts, by replica, the adapters loaded into a GPU slot in
	// the measurement window (ServerParams.LoRALoad each).
	Loads []int `json:"loads"`
	// Classes splits the calls by request class (the lora-slots
	// workload classes adapters by popularity: hot, warm, cold; and
	// base), sorted by class name.
	Classes []LoRAClass `json:"classes,omitempty"`
}

// LoRAClass is the latency of one class of calls.
type LoRAClass struct {
	Class        string  `json:"class"`
	Calls        int     `json:"calls"`
	TTFTP50      float64 `json:"ttft_p50_s"`
	TTFTP99      float64 `json:"ttft_p99_s"`
	E2EP50       float64 `json:"e2e_p50_s"`
	E2EP99       float64 `json:"e2e_p99_s"`
	SlotWaitMean float64 `json:"slot_wait_mean_s"`
}

// TotalLoads is the fleet's adapter loads in the window.
func (l *LoRAResult) TotalLoads() int {
	n := 0
	for _, v := range l.Loads {
		n += v
	}
	return n
}

// loraStats gathers LoRAResult while a run goes; a nil *loraStats
// gathers nothing.
type loraStats struct {
	waits   []float64 // of measured adapter calls
	waited  int
	classes map[string]*loraClass // read in sorted key order
}

type loraClass struct {
	ttft, e2e []float64
	wait      float64
}

// add records a measured call that completed or was left unfinished.
func (l *loraStats) add(req *Request, ttft, e2e float64, wait time.Duration, waited bool) {
	if l == nil {
		return
	}
	if req.Model != Model && req.Model != "" {
		l.waits = append(l.waits, wait.Seconds())
		if waited {
			l.waited++
		}
	}
	if req.Class == "" {
		return
	}
	c := l.classes[req.Class]
	if c == nil {
		c = &loraClass{}
		l.classes[req.Class] = c
	}
	c.ttft, c.e2e = append(c.ttft, ttft), append(c.e2e, e2e)
	c.wait += wait.Seconds()
}

func (l *loraStats) result(loads0, loads1 []int) *LoRAResult {
	res := &LoRAResult{AdapterCalls: len(l.waits), SlotWaited: l.waited, Loads: make([]int, len(loads1))}
	for i := range loads1 {
		res.Loads[i] = loads1[i]
		if i < len(loads0) {
			res.Loads[i] -= loads0[i]
		}
	}
	for _, w := range l.waits {
		res.SlotWaitTotal += w
	}
	if n := len(l.waits); n > 0 {
		res.SlotWaitMean = res.SlotWaitTotal / float64(n)
		slices.Sort(l.waits)
		res.SlotWaitP99 = pct(l.waits, 99)
	}
	for _, k := range slices.Sorted(mapsKeys(l.classes)) {
		c := l.classes[k]
		slices.Sort(c.ttft)
		slices.Sort(c.e2e)
		res.Classes = append(res.Classes, LoRAClass{
			Class: k, Calls: len(c.e2e),
			TTFTP50: pct(c.ttft, 50), TTFTP99: pct(c.ttft, 99),
			E2EP50: pct(c.e2e, 50), E2EP99: pct(c.e2e, 99),
			SlotWaitMean: c.wait / float64(max(len(c.e2e), 1)),
		})
	}
	return res
}
