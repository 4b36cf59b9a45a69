package fleetsim

import (
	"time"

	"github.com/inferlb/inferlb"
)

// dpStatsInterval is how often the front end of a data-parallel engine
// learns its ranks' queue lengths: vLLM's DP coordinator collects each
// engine core's waiting and running counts and publishes them to the API
// servers every 100 ms.
const dpStatsInterval = 100 * time.Millisecond

// dpFront is the front end of one data-parallel engine as a default vLLM
// deployment (--data-parallel-size N, internal load balancing) runs it:
// one API server, one endpoint, and in it DPLBAsyncMPClient, which sends
// each call to the rank of least waiting*4 + running, scanning from rank
// 0 and keeping the first on a tie, with the counts the coordinator last
// published (dpStatsInterval); between publications it adds each call it
// sends to its rank's waiting count. The counts are the ranks' gauges, as
// of their last step (replica.snapshot), which is when an engine core
// reports them.
type dpFront struct {
	e      *dpEngine
	counts [][2]int // waiting, running by rank, as last published plus the calls sent since
}

// refresh takes the counts the coordinator publishes now, and schedules
// the next publication while the run goes on.
func (f *dpFront) refresh(s *run) {
	for k, r := range f.e.ranks {
		f.counts[k] = [2]int{r.gauges.waiting, r.gauges.running}
	}
	if !s.stopped || s.outstanding > 0 {
		s.after(dpStatsInterval, func() { f.refresh(s) })
	}
}

// pick returns the index of the rank a call goes to.
func (f *dpFront) pick() int {
	best, bestScore := 0, -1
	for k, c := range f.counts {
		if score := c[0]*4 + c[1]; bestScore < 0 || score < bestScore {
			best, bestScore = k, score
		}
	}
	f.counts[best][0]++
	return f.e.ranks[best].idx
}

// engineFronted is a baseline policy's router in a fleet of data-parallel
// engines, as it meets a default vLLM deployment: one endpoint per engine,
// which stands for the engine's lowest rank in the members the wrapped
// router sees, and the engine's front end (dpFront) picks the rank. The
// replicas of no engine are endpoints of their own. Policies with
// SeesRanks (inferlb, which reads DPLabel, and the oracle) see every rank.
type engineFronted struct {
	Router
	s *run
}

func (r *engineFronted) SetMembers(m []int) {
	out := make([]int, 0, len(m))
	for _, i := range m {
		rep := r.s.reps[i]
		if rep.dp != nil && rep.dp.front != nil {
			i = rep.dp.ranks[0].idx
			if len(out) > 0 && out[len(out)-1] == i {
				continue // members ascend, and an engine's ranks with them
			}
		}
		out = append(out, i)
	}
	r.Router.SetMembers(out)
}

func (r *engineFronted) Pick(req *Request) (int, func(inferlb.Outcome), error) {
	i, done, err := r.Router.Pick(req)
	if err != nil {
		return i, done, err
	}
	if e := r.s.reps[i].dp; e != nil && e.front != nil {
		i = e.front.pick()
	}
	return i, done, nil
}
