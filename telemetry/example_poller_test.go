package telemetry_test

import (
	"context"
	"fmt"
	"time"

	"github.com/inferlb/inferlb/telemetry"
)

func ExamplePoller() {
	// A Source: here a fixed reading; in use dcgm.Source, modelserver.Source
	// or promapi.Source.
	src := telemetry.SourceFunc(func(context.Context) ([]telemetry.Observation, error) {
		var s telemetry.Sample
		s.Set(telemetry.KVCacheUsage, 0.95)
		return []telemetry.Observation{{EndpointID: "10.0.0.1:8000", Sample: s}}, nil
	})
	var store telemetry.Store // a *balancer.Balancer is a Sink too
	p, err := telemetry.NewPoller(src, &store, telemetry.PollerOptions{Interval: 10 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	// Run(ctx) polls every Interval (jittered, backing off on errors) until
	// ctx ends; one round by hand:
	p.Poll(context.Background())
	s, _ := store.Latest("10.0.0.1:8000", time.Now(), time.Minute)
	kv, _ := s.Get(telemetry.KVCacheUsage)
	fmt.Println(kv, p.Stats().Published)
	// Output: 0.95 1
}
