package fleetsim_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb/benchmarks/fleetsim"
)

// Quick used to halve every event's time while it cut the measured window
// to a third, so incidents drifted out of it: model-failure's model
// recovered at 165 s, after the quick window's end at 160 s, and hung's
// restart came 5 s before it. An event keeps its place in the window.
func TestQuickKeepsEachEventWhereItWasInTheWindow(t *testing.T) {
	for _, sc := range fleetsim.Scenarios() {
		q := sc.Quick()
		if !assert.Len(t, q.Events, len(sc.Events), sc.Name) {
			continue
		}
		place := func(at, warmup, end time.Duration) float64 {
			return float64(at-warmup) / float64(end-warmup)
		}
		for i, ev := range sc.Events {
			got := q.Events[i].At
			switch {
			case ev.At < sc.Warmup:
				assert.Less(t, got, q.Warmup, "%s event %d at %v", sc.Name, i, ev.At)
				assert.InDelta(t, float64(ev.At)/float64(sc.Warmup), float64(got)/float64(q.Warmup), 1e-9, "%s event %d", sc.Name, i)
			default:
				assert.GreaterOrEqual(t, got, q.Warmup, "%s event %d at %v", sc.Name, i, ev.At)
				assert.InDelta(t, place(ev.At, sc.Warmup, sc.Duration), place(got, q.Warmup, q.Duration), 1e-9,
					"%s event %d at %v: quick %v in [%v, %v)", sc.Name, i, ev.At, got, q.Warmup, q.Duration)
			}
		}
	}
}
