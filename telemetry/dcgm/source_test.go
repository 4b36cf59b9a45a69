package dcgm_test

import (
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/dcgm"
)

// page is a dcgm-exporter exposition for one node whose GPU i has usedMiB[i]
// of 1000 MiB in use.
func page(host string, usedMiB ...float64) string {
	var b strings.Builder
	for i, used := range usedMiB {
		l := fmt.Sprintf(`{gpu="%d",UUID="GPU-%s-%d",Hostname="%s"}`, i, host, i, host)
		fmt.Fprintf(&b, "DCGM_FI_DEV_FB_USED%s %g\nDCGM_FI_DEV_FB_FREE%s %g\n", l, used, l, 1000-used)
	}
	return b.String()
}

// exporter is a fake dcgm-exporter that counts its scrapes. With a gate, a
// scrape signals arrived (the first one only) and answers once release is
// closed.
type exporter struct {
	url     string
	hits    atomic.Int64
	arrived chan struct{}
	release chan struct{}
}

func newExporter(t *testing.T, body string, gated bool) *exporter {
	t.Helper()
	e := &exporter{}
	if gated {
		e.arrived, e.release = make(chan struct{}, 1), make(chan struct{})
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.hits.Add(1)
		if e.release != nil {
			select {
			case e.arrived <- struct{}{}:
			default:
			}
			select {
			case <-e.release:
			case <-r.Context().Done():
				return
			}
		}
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	e.url = srv.URL + "/metrics"
	return e
}

// target is e's Target, mapping its node's GPUs to the endpoint id.
func (e *exporter) target(host, id string) dcgm.Target {
	return dcgm.Target{URL: e.url, Map: dcgm.ByHost(map[string]string{id: host})}
}

func client(t *testing.T) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// fleet is what a user keeps in step with the cluster (an informer's
// handlers call set); Source.Targets reads it once per round.
type fleet struct {
	mu      sync.Mutex
	targets []dcgm.Target
}

func (f *fleet) set(ts ...dcgm.Target) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.targets = ts // a new slice on each change: a round may still hold the old one
}

func (f *fleet) current() []dcgm.Target {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.targets
}

// recorder is a Sink that keeps each endpoint's memory usage since its last
// take.
type recorder struct {
	mu  sync.Mutex
	got map[string]float64
}

func (r *recorder) Publish(id string, s telemetry.Sample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.got == nil {
		r.got = map[string]float64{}
	}
	r.got[id], _ = s.MemoryUsage()
}

func (r *recorder) take() map[string]float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	got := r.got
	r.got = nil
	return got
}

func hits(es ...*exporter) []int64 {
	out := make([]int64, len(es))
	for i, e := range es {
		out[i] = e.hits.Load()
	}
	return out
}

func TestSourceTargetsFollowMembership(t *testing.T) {
	a := newExporter(t, page("node-a", 100), false)
	b := newExporter(t, page("node-b", 200), false)
	c := newExporter(t, page("node-c", 300), false)
	var f fleet
	src := &dcgm.Source{Targets: f.current, Client: client(t)}
	var rec recorder
	p, err := telemetry.NewPoller(src, &rec, telemetry.PollerOptions{Clock: testutil.NewClock()})
	require.NoError(t, err)

	// Membership changes on its own goroutine, as an informer's would.
	changes := make(chan []dcgm.Target)
	applied := make(chan struct{})
	go func() {
		defer close(applied)
		for ts := range changes {
			f.set(ts...)
			applied <- struct{}{}
		}
	}()
	change := func(ts ...dcgm.Target) {
		changes <- ts
		<-applied
	}
	defer func() { close(changes); <-applied }()

	change(a.target("node-a", "ep-a"), b.target("node-b", "ep-b"))
	require.True(t, p.Poll(t.Context()))
	assert.Equal(t, []int64{1, 1, 0}, hits(a, b, c))
	assert.Equal(t, map[string]float64{"ep-a": 0.1, "ep-b": 0.2}, rec.take())

	// node-a leaves, node-c joins: the next round scrapes exactly b and c,
	// and ep-a's sample is not published again.
	change(b.target("node-b", "ep-b"), c.target("node-c", "ep-c"))
	require.True(t, p.Poll(t.Context()))
	assert.Equal(t, []int64{1, 2, 1}, hits(a, b, c))
	assert.Equal(t, map[string]float64{"ep-b": 0.2, "ep-c": 0.3}, rec.take())

	// Every node gone: a round with no targets is an empty success.
	change()
	require.True(t, p.Poll(t.Context()))
	assert.Equal(t, []int64{1, 2, 1}, hits(a, b, c))
	assert.Empty(t, rec.take())
	assert.Equal(t, telemetry.PollerStats{Rounds: 3, Published: 4}, p.Stats())
}

// TestSourceTargetsChangeDuringRounds changes the targets while rounds run,
// with no ordering between the two goroutines (the race detector watches):
// each round scrapes one of the two lists whole, never a mix.
func TestSourceTargetsChangeDuringRounds(t *testing.T) {
	a := newExporter(t, page("node-a", 100), false)
	b := newExporter(t, page("node-b", 200), false)
	c := newExporter(t, page("node-c", 300), false)
	ab := []dcgm.Target{a.target("node-a", "ep-a"), b.target("node-b", "ep-b")}
	bc := []dcgm.Target{b.target("node-b", "ep-b"), c.target("node-c", "ep-c")}
	var f fleet
	f.set(ab...)
	src := &dcgm.Source{Targets: f.current, Client: client(t)}
	var rec recorder
	p, err := telemetry.NewPoller(src, &rec, telemetry.PollerOptions{Clock: testutil.NewClock()})
	require.NoError(t, err)

	stop := make(chan struct{})
	flipped := make(chan struct{})
	go func() {
		defer close(flipped)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if i%2 == 0 {
				f.set(bc...)
			} else {
				f.set(ab...)
			}
		}
	}()
	before := hits(a, b, c)
	for range 20 {
		require.True(t, p.Poll(t.Context()))
		now := hits(a, b, c)
		scraped := []int64{now[0] - before[0], now[1] - before[1], now[2] - before[2]}
		before = now
		got := slices.Sorted(maps.Keys(rec.take()))
		switch {
		case slices.Equal(scraped, []int64{1, 1, 0}):
			assert.Equal(t, []string{"ep-a", "ep-b"}, got)
		case slices.Equal(scraped, []int64{0, 1, 1}):
			assert.Equal(t, []string{"ep-b", "ep-c"}, got)
		default:
			t.Fatalf("a round scraped a, b, c %v times: neither list", scraped)
		}
	}
	close(stop)
	<-flipped
}

// TestSourceTargetRemovedMidRound: a round scrapes the list it read at its
// start, so a node that leaves while the round runs is scraped once more and
// its endpoint's sample published, which the Balancer (whose endpoint left
// too) drops as unknown; the next round does not scrape it.
func TestSourceTargetRemovedMidRound(t *testing.T) {
	a := newExporter(t, page("node-a", 100), true)
	b := newExporter(t, page("node-b", 200), false)
	clk := testutil.NewClock()
	bal := balancer.New(balancer.Options{Clock: clk})
	require.NoError(t, bal.Update([]inferlb.Endpoint{{ID: "ep-a", Addr: "10.0.0.1:8000"}, {ID: "ep-b", Addr: "10.0.0.2:8000"}}))
	var f fleet
	f.set(a.target("node-a", "ep-a"), b.target("node-b", "ep-b"))
	src := &dcgm.Source{Targets: f.current, Client: client(t)}
	p, err := telemetry.NewPoller(src, bal, telemetry.PollerOptions{Clock: clk})
	require.NoError(t, err)

	ok := make(chan bool)
	go func() { ok <- p.Poll(t.Context()) }()
	<-a.arrived // the round is scraping node-a
	f.set(b.target("node-b", "ep-b"))
	require.NoError(t, bal.Update([]inferlb.Endpoint{{ID: "ep-b", Addr: "10.0.0.2:8000"}}))
	close(a.release)
	require.True(t, <-ok)
	assert.Equal(t, []int64{1, 1}, hits(a, b))
	assert.Equal(t, uint64(1), bal.Telemetry().Stats().DroppedUnknown, "ep-a's last sample, dropped")
	s, found := bal.Telemetry().Latest("ep-b", clk.Now(), time.Minute)
	require.True(t, found)
	u, _ := s.MemoryUsage()
	assert.InDelta(t, 0.2, u, 1e-12)

	clk.Advance(5 * time.Second)
	require.True(t, p.Poll(t.Context()))
	assert.Equal(t, []int64{1, 2}, hits(a, b), "node-a is no longer scraped")
	assert.Equal(t, uint64(1), bal.Telemetry().Stats().DroppedUnknown, "nothing more for ep-a")
	assert.Equal(t, uint64(3), p.Stats().Published)
}

func TestSourceTargetsAndURLs(t *testing.T) {
	a := newExporter(t, page("node-a", 100, 900), false)
	b := newExporter(t, page("node-b", 200), false)
	c := newExporter(t, page("node-c", 300), false)
	targets := dcgm.Static(
		a.target("node-a", "ep-a"), // the fuller GPU of two
		dcgm.Target{URL: b.url, Map: dcgm.ByHost(map[string]string{"ep-b": "node-b", "ep-b2": "node-b"})},
		dcgm.Target{URL: c.url}, // through Source.Map
	)
	src := &dcgm.Source{
		Targets: targets,
		URLs:    []string{c.url}, // scraped after Targets' list, through Source.Map too
		Map: func(g *dcgm.GPU) []string {
			switch g.Host {
			case "node-c":
				return []string{"ep-c"}
			case "node-a":
				return []string{"ep-x"} // a's target has a Map of its own: unused
			}
			return nil
		},
		Client: client(t),
	}
	for range 2 { // Collect leaves Static's list as it was
		obs, err := src.Collect(t.Context())
		require.NoError(t, err)
		got := map[string]float64{}
		var ids []string
		for _, o := range obs {
			got[o.EndpointID], _ = o.Sample.MemoryUsage()
			ids = append(ids, o.EndpointID)
		}
		assert.Equal(t, []string{"ep-a", "ep-b", "ep-b2", "ep-c"}, ids, "in order of first appearance")
		assert.Equal(t, map[string]float64{"ep-a": 0.9, "ep-b": 0.2, "ep-b2": 0.2, "ep-c": 0.3}, got)
		assert.Len(t, targets(), 3)
	}
	assert.Equal(t, []int64{2, 2, 2}, hits(a, b, c), "c, listed twice, is scraped once a round")
}

// An exporter listed more than once (in Targets and URLs, or spelled two
// ways) is scraped once a round, and its GPUs go through every Mapping it
// was listed with.
func TestSourceScrapesEachExporterOnce(t *testing.T) {
	a := newExporter(t, page("node-a", 100), false)
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	shout := strings.Replace(a.url, "http://", "HTTP://", 1)
	src := &dcgm.Source{
		Targets: dcgm.Static(a.target("node-a", "ep-a"), dcgm.Target{URL: shout}, dcgm.Target{URL: down.URL}),
		URLs:    []string{a.url, a.url + "#gpus", down.URL + "/"},
		Map: func(g *dcgm.GPU) []string {
			if g.Host == "node-a" {
				return []string{"ep-x"}
			}
			return nil
		},
		Client: client(t),
	}
	obs, err := src.Collect(t.Context())
	require.ErrorIs(t, err, telemetry.ErrPartial)
	assert.ErrorContains(t, err, "1 of 2 exporters failed")
	got := map[string]float64{}
	for _, o := range obs {
		got[o.EndpointID], _ = o.Sample.MemoryUsage()
	}
	assert.Equal(t, map[string]float64{"ep-a": 0.1, "ep-x": 0.1}, got)
	assert.Equal(t, []int64{1}, hits(a))
}

func TestSourceTargetSpanningNodes(t *testing.T) {
	a := newExporter(t, page("node-a", 100, 900), false)
	b := newExporter(t, page("node-b", 200), false)
	both := func(*dcgm.GPU) []string { return []string{"tp"} }
	src := &dcgm.Source{Targets: dcgm.Static(dcgm.Target{URL: b.url, Map: both}, dcgm.Target{URL: a.url, Map: both}), Client: client(t)}
	obs, err := src.Collect(t.Context())
	require.NoError(t, err)
	require.Len(t, obs, 1)
	u, _ := obs[0].Sample.MemoryUsage()
	assert.InDelta(t, 0.9, u, 1e-12, "the fullest GPU of either node")
}

func TestSourceNoTargets(t *testing.T) {
	obs, err := (&dcgm.Source{}).Collect(t.Context())
	assert.NoError(t, err, "the zero Source has no targets")
	assert.Empty(t, obs)

	obs, err = (&dcgm.Source{Targets: dcgm.Static()}).Collect(t.Context())
	assert.NoError(t, err, "no targets need no Map")
	assert.Empty(t, obs)
}

func TestSourceTargetWithoutMap(t *testing.T) {
	a := newExporter(t, page("node-a", 100), false)
	b := newExporter(t, page("node-b", 200), false)
	src := &dcgm.Source{
		Targets: dcgm.Static(a.target("node-a", "ep-a"), dcgm.Target{URL: b.url}),
		Client:  client(t),
	}
	_, err := src.Collect(t.Context())
	require.ErrorContains(t, err, "dcgm: Source.Map is nil")
	assert.ErrorContains(t, err, b.url)
	assert.NotErrorIs(t, err, telemetry.ErrPartial)
	assert.Equal(t, []int64{0, 0}, hits(a, b), "a configuration error, before any scrape")
}

// An exporter scraped with credentials in its URL: the errors that name
// it (OnError logs them) must not carry the password.
func TestSourceErrorsRedactThePassword(t *testing.T) {
	e := newExporter(t, "node_cpu_seconds_total 1\n", false) // not a dcgm-exporter
	url := strings.Replace(e.url, "http://", "http://scraper:s3cr3t@", 1)
	_, err := (&dcgm.Source{Client: client(t), URLs: []string{url}, Map: dcgm.ByHost(nil)}).Collect(t.Context())
	require.ErrorIs(t, err, dcgm.ErrNoGPUs)
	assert.NotContains(t, err.Error(), "s3cr3t")
	assert.Contains(t, err.Error(), "scraper:xxxxx@")

	_, err = (&dcgm.Source{Client: client(t), Targets: dcgm.Static(dcgm.Target{URL: url})}).Collect(t.Context())
	require.ErrorContains(t, err, "no Map")
	assert.NotContains(t, err.Error(), "s3cr3t")
}

// dcgm-exporter writes the text format, but a proxy or sidecar in front of
// it may answer OpenMetrics. Cut short at a line boundary (a connection
// closed mid-body without a length, a proxy's size limit), such a body has
// no unfinished line to betray it, only a missing "# EOF": it was read as
// the text format, and a node cut after its idle GPU's lines read as idle,
// its full GPU unseen. Served as OpenMetrics, it is now a failed scrape:
// counted, none of it read, the other exporters unaffected.
func TestSourceRejectsOpenMetricsCutShort(t *testing.T) {
	serveAs := func(contentType, body string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", contentType)
			_, _ = w.Write([]byte(body))
		}))
		t.Cleanup(srv.Close)
		return srv.URL + "/metrics"
	}
	const openMetrics = "application/openmetrics-text; version=1.0.0; charset=utf-8"
	whole := page("node-a", 100, 900) + "# EOF\n"
	cut := page("node-a", 100) // GPU 0's lines: the body stops before GPU 1's
	require.True(t, strings.HasPrefix(whole, cut))
	byHost := dcgm.ByHost(map[string]string{"ep-a": "node-a", "ep-b": "node-b"})
	src := &dcgm.Source{Client: client(t), Map: byHost, URLs: []string{
		serveAs(openMetrics, cut),
		serveAs(openMetrics, page("node-b", 200)+"# EOF\n"),
	}}
	obs, err := src.Collect(t.Context())
	require.ErrorIs(t, err, telemetry.ErrPartial)
	assert.ErrorContains(t, err, "1 of 2 exporters failed")
	assert.ErrorContains(t, err, "# EOF")
	got := map[string]float64{}
	for _, o := range obs {
		got[o.EndpointID], _ = o.Sample.MemoryUsage()
	}
	assert.Equal(t, map[string]float64{"ep-b": 0.2}, got, "node-a is not read as idle")

	src.URLs = []string{serveAs(openMetrics, whole)}
	obs, err = src.Collect(t.Context())
	require.NoError(t, err)
	require.Len(t, obs, 1)
	u, _ := obs[0].Sample.MemoryUsage()
	assert.InDelta(t, 0.9, u, 1e-12, "a whole OpenMetrics body is read")
}

// A round's error goes to OnError's log, and read "telemetry: partial
// result: dcgm: 0 of 2 exporters failed, 1 partial; first: http://...:
// telemetry: partial result: dcgm: exposition partly read ...", and "dcgm:
// all 1 exporters failed; first: dcgm: scrape: ...": each prefix twice. An
// exporter's error no longer repeats them, and errors.Is still finds
// ErrPartial through it.
func TestCollectErrorSaysEachPrefixOnce(t *testing.T) {
	const l = `{gpu="0",UUID="GPU-0",Hostname="node-a"}`
	good := newExporter(t, "DCGM_FI_DEV_FB_USED"+l+" 100\nDCGM_FI_DEV_FB_FREE"+l+" 100\n", false)
	cut := newExporter(t, "DCGM_FI_DEV_FB_USED"+l+" 100\nDCGM_FI_DEV_FB_FREE"+l+" 100\nDCGM_FI_DEV_GPU_UT", false)
	m := dcgm.ByHost(map[string]string{"a": "node-a"})
	src := &dcgm.Source{Targets: dcgm.Static(dcgm.Target{URL: good.url, Map: m}, dcgm.Target{URL: cut.url, Map: m})}
	_, err := src.Collect(t.Context())
	require.ErrorIs(t, err, telemetry.ErrPartial)
	assert.Equal(t, 1, strings.Count(err.Error(), "dcgm: "), err.Error())
	assert.Equal(t, 1, strings.Count(err.Error(), "partial result"), err.Error())
	assert.Contains(t, err.Error(), "first: "+cut.url+": exposition partly read")

	down := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(down.Close)
	src = &dcgm.Source{Targets: dcgm.Static(dcgm.Target{URL: down.URL + "/metrics", Map: m})}
	_, err = src.Collect(t.Context())
	require.Error(t, err)
	assert.Equal(t, 1, strings.Count(err.Error(), "dcgm: "), err.Error())
	assert.Contains(t, err.Error(), "first: scrape: GET "+down.URL+"/metrics: status 404")
}
