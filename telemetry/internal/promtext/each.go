package promtext

import (
	"context"
	"time"

	"golang.org/x/sync/errgroup"
)

// Each calls scrape(ctx, i) for every i in [0, n), in order of i and at
// most par at a time (par <= 0 means 1), and returns when every call has.
//
// A scrape that hangs (its target's node went down, and the connection is
// blackholed) holds its place until its context ends. Under ctx's deadline
// alone, par hung targets would hold every place until the round was over,
// and the targets queued behind them would start with no time left: a few
// dead nodes would black out every target's telemetry. So while par or more
// targets are still to start after it, a scrape gets at most half the time
// left (the rest is for them); the last par to start get all of it. Every
// target starts before the deadline, and a healthy one queued behind any
// number of hung ones still gets a share of the round. Without a deadline
// on ctx, scrapes are bounded by ctx alone.
func Each(ctx context.Context, n, par int, scrape func(ctx context.Context, i int)) {
	par = max(par, 1)
	var g errgroup.Group
	g.SetLimit(par)
	deadline, bounded := ctx.Deadline()
	for i := range n {
		g.Go(func() error {
			if bounded && n-1-i >= par {
				sctx, cancel := context.WithTimeout(ctx, time.Until(deadline)/2)
				defer cancel()
				scrape(sctx, i)
				return nil
			}
			scrape(ctx, i)
			return nil
		})
	}
	_ = g.Wait()
}
