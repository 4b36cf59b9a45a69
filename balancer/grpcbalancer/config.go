package grpcbalancer

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/serviceconfig"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
)

// DefaultOOBInterval is how often out-of-band ORCA reports are requested
// when "orca.outOfBand" is on and no interval is given. The server may send
// them less often: grpc-go's ORCA service (orca.Register) sends them at
// most every 30s, a floor its orca.ServiceOptions.MinReportingInterval can
// raise but not lower (grpc-go v1.85), and 30s is also the core's default
// telemetry age. With such a server and no per-call
// reports, set "balancer.telemetryMaxAge" above the server's interval
// (45s, say), or each report is stale for a moment before the next. An
// interval longer than telemetryMaxAge (a NewBuilder policy's Balancer's
// TelemetryMaxAge) is refused: every report would be ignored for most of
// its life.
const DefaultOOBInterval = 10 * time.Second

// jsonConfig is the service config as written. Durations are strings parsed
// in a second pass so an error can name the field.
type jsonConfig struct {
	Methods           map[string]string       `json:"methods"`
	DefaultService    string                  `json:"defaultService"`
	AffinityKeyHeader string                  `json:"affinityKeyHeader"`
	TenantHeader      string                  `json:"tenantHeader"`
	ModelHeader       string                  `json:"modelHeader"`
	IDByHost          bool                    `json:"idByHost"`
	Endpoints         map[string]jsonEndpoint `json:"endpoints"`
	ORCA              *jsonORCA               `json:"orca"`
	Balancer          *jsonTunables           `json:"balancer"`
}

// jsonEndpoint is one entry of "endpoints": what WithEndpoint would say
// of the address it is keyed by.
type jsonEndpoint struct {
	ID     string            `json:"id"`
	Weight float64           `json:"weight"`
	Labels map[string]string `json:"labels"`
}

type jsonORCA struct {
	PerCall   *bool  `json:"perCall"`
	OutOfBand bool   `json:"outOfBand"`
	Interval  string `json:"interval"`
}

// jsonTunables mirrors the scalar fields of core.Options; the zero value
// of each means the core's default, exactly as in Options. It is comparable,
// so a policy can tell whether a new config changes its Balancer.
type jsonTunables struct {
	TelemetryMaxAge     string  `json:"telemetryMaxAge"`
	LatencyDecay        string  `json:"latencyDecay"`
	ErrorAlpha          float64 `json:"errorAlpha"`
	ErrorDecay          string  `json:"errorDecay"`
	PanicThreshold      float64 `json:"panicThreshold"`
	DefaultCooldown     string  `json:"defaultCooldown"`
	MaxCooldown         string  `json:"maxCooldown"`
	NotServedMemory     string  `json:"notServedMemory"`
	SlowStartWindow     string  `json:"slowStartWindow"`
	SlowStartMinWeight  float64 `json:"slowStartMinWeight"`
	SlowStartAggression float64 `json:"slowStartAggression"`
	RetryRatio          float64 `json:"retryRatio"`
	RetryFloor          float64 `json:"retryFloor"`
	Affinity            string  `json:"affinity"`
	LoadBound           float64 `json:"loadBound"`
	AffinitySeed        uint64  `json:"affinitySeed"`
	TenantShardSize     int     `json:"tenantShardSize"`
	TenantShardStrict   bool    `json:"tenantShardStrict"`
	SpillMemory         string  `json:"spillMemory"`
	MinKeyReuse         float64 `json:"minKeyReuse"`
	AdapterHomes        float64 `json:"adapterHomes"`
	ScanLimit           int     `json:"scanLimit"`
	BreakerFailures     int     `json:"breakerFailures"`
	BreakerProbes       int     `json:"breakerProbes"`
	EjectionTime        string  `json:"ejectionTime"`
	MaxEjectionTime     string  `json:"maxEjectionTime"`
	MaxEjectedFraction  float64 `json:"maxEjectedFraction"`
	OutlierInterval     string  `json:"outlierInterval"`
	OutlierMinRequests  int     `json:"outlierMinRequests"`
	OutlierMargin       float64 `json:"outlierMargin"`
	SubsetLabel         string  `json:"subsetLabel"`
	DPGroupLabel        string  `json:"dpGroupLabel"`
	StickyTTL           string  `json:"stickyTTL"`
	StickyEntries       int     `json:"stickyEntries"`
}

// lbConfig is the parsed, validated and defaulted config. It is immutable
// once ParseConfig returns; pickers share it.
type lbConfig struct {
	serviceconfig.LoadBalancingConfig

	exact          map[string]inferlb.Service // "/pkg.Svc/Method"; nil when empty
	prefix         map[string]inferlb.Service // "/pkg.Svc/"; nil when empty
	defaultService inferlb.Service
	// templates holds one read-only Request per Service, so a call whose
	// facts come from its method alone is routed without building one.
	templates [inferlb.NumServices]inferlb.Request

	affinityHeader string // its value is hashed with the core's Keyer
	tenantHeader   string
	modelHeader    string

	idByHost bool // endpoints without a WithEndpoint ID are named by host, not host:port
	// endpoints describes endpoints by address (canonicalAddr), for those
	// whose resolver gives no WithEndpoint; nil when the config has none.
	endpoints map[string]*endpointAttr

	orcaPerCall bool
	oob         bool
	oobInterval time.Duration

	tunables    jsonTunables // canonical (see canonical), for change detection
	hasTunables bool
	opts        core.Options // tunables applied; zero when absent
}

// readsMetadata reports whether picks look at outgoing metadata at all.
func (c *lbConfig) readsMetadata() bool {
	return c.affinityHeader != "" || c.tenantHeader != "" || c.modelHeader != ""
}

// service maps a full method name ("/pkg.Svc/Method") to a Service: an
// exact entry first, then the service-wide prefix, then the default. It
// does not allocate.
func (c *lbConfig) service(method string) inferlb.Service {
	if c.exact != nil {
		if s, ok := c.exact[method]; ok {
			return s
		}
	}
	if c.prefix != nil {
		if i := strings.LastIndexByte(method, '/'); i > 0 {
			if s, ok := c.prefix[method[:i+1]]; ok {
				return s
			}
		}
	}
	return c.defaultService
}

// configError formats a parse error that names the field.
func configError(field, format string, args ...any) error {
	return fmt.Errorf("inferlb: service config field %s: %s", field, fmt.Sprintf(format, args...))
}

// parseConfig parses, validates and defaults the policy's JSON config.
// shared is the caller's Balancer the policy routes with (NewBuilder), nil
// when it builds its own: a shared one's tunables are fixed and so may not
// appear in the config, and its TelemetryMaxAge bounds orca.interval.
func parseConfig(js json.RawMessage, shared *core.Balancer) (*lbConfig, error) {
	var raw jsonConfig
	if len(bytes.TrimSpace(js)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&raw); err != nil {
			return nil, decodeError(js, err)
		}
		if _, err := dec.Token(); err != io.EOF {
			return nil, errors.New("inferlb: service config: unexpected data after the JSON object")
		}
		if err := duplicateKey(js); err != nil {
			return nil, err
		}
	}
	c := &lbConfig{orcaPerCall: true, idByHost: raw.IDByHost}

	for m, name := range raw.Methods {
		field := fmt.Sprintf("methods[%q]", m)
		if strings.TrimSpace(name) == "" {
			// null or "": ParseService reads it as unknown, which
			// would quietly override defaultService for the entry.
			return nil, configError(field, "want llm, embedding, rerank or unknown, not an empty service")
		}
		svc, err := inferlb.ParseService(name)
		if err != nil {
			return nil, configError(field, "%s", strings.TrimPrefix(err.Error(), "inferlb: "))
		}
		switch {
		case !strings.HasPrefix(m, "/") || strings.Count(m, "/") != 2 || strings.HasPrefix(m, "//"):
			return nil, configError(field, `want "/package.Service/Method" or the service-wide "/package.Service/"`)
		case strings.ContainsFunc(m, func(r rune) bool { return r <= ' ' || r == 0x7f }):
			// No call's method has one (it is an HTTP/2 :path): a stray
			// space would make the entry silently match nothing.
			return nil, configError(field, "a method name has no spaces or control characters")
		case strings.Contains(m, "*"):
			// No method or service of a .proto has one: the entry would
			// silently match nothing, as a glob that is not one.
			return nil, configError(field, `no wildcards: "/package.Service/" covers every method of a service`)
		case strings.HasSuffix(m, "/"):
			if c.prefix == nil {
				c.prefix = map[string]inferlb.Service{}
			}
			c.prefix[m] = svc
		default:
			if c.exact == nil {
				c.exact = map[string]inferlb.Service{}
			}
			c.exact[m] = svc
		}
	}
	svc, err := inferlb.ParseService(raw.DefaultService)
	if err != nil {
		return nil, configError("defaultService", "%s", strings.TrimPrefix(err.Error(), "inferlb: "))
	}
	c.defaultService = svc
	for s := range inferlb.NumServices {
		c.templates[s] = inferlb.Request{Service: inferlb.Service(s)}
	}

	if c.endpoints, err = parseEndpoints(raw.Endpoints); err != nil {
		return nil, err
	}

	headers := []struct {
		field string
		src   string
		dst   *string
	}{
		{"affinityKeyHeader", raw.AffinityKeyHeader, &c.affinityHeader},
		{"tenantHeader", raw.TenantHeader, &c.tenantHeader},
		{"modelHeader", raw.ModelHeader, &c.modelHeader},
	}
	for _, h := range headers {
		if h.src == "" {
			continue
		}
		key := strings.ToLower(h.src)
		if !validKey(key) {
			return nil, configError(h.field, "%q is not a valid metadata key (want letters, digits, '-', '_' or '.')", h.src)
		}
		if strings.HasPrefix(key, "grpc-") {
			return nil, configError(h.field, "%q: keys starting with \"grpc-\" are reserved by gRPC", h.src)
		}
		*h.dst = key
	}

	if o := raw.ORCA; o != nil {
		if o.PerCall != nil {
			c.orcaPerCall = *o.PerCall
		}
		c.oob = o.OutOfBand
		if o.Interval != "" {
			d, err := parseDuration("orca.interval", o.Interval)
			if err != nil {
				return nil, err
			}
			if d <= 0 {
				return nil, configError("orca.interval", "%q must be positive", o.Interval)
			}
			c.oobInterval = d
		}
	}
	if c.oobInterval == 0 {
		c.oobInterval = DefaultOOBInterval
	}

	if raw.Balancer != nil {
		if shared != nil {
			return nil, configError("balancer", "not allowed: this policy routes with a caller-provided *balancer.Balancer, whose options were fixed by balancer.New")
		}
		c.hasTunables = true
		if c.opts, err = raw.Balancer.options(); err != nil {
			return nil, err
		}
		c.tunables = raw.Balancer.canonical(&c.opts)
	}
	// An interval past the age at which a report is ignored would leave
	// the endpoints' load unknown most of the time: every report stale
	// before the next came. A negative age never goes stale (0 here).
	// An interval the config does not give is the default: say so, and
	// what to set, or the error names a value the config does not have.
	interval, shorten := c.oobInterval.String(), "shorten it"
	if raw.ORCA == nil || raw.ORCA.Interval == "" {
		interval, shorten = fmt.Sprintf("the default %s (DefaultOOBInterval: none given)", c.oobInterval), "give a shorter one"
	}
	switch {
	case !c.oob:
	case shared != nil:
		if maxAge := shared.TelemetryMaxAge(); maxAge > 0 && c.oobInterval > maxAge {
			return nil, configError("orca.interval", "%s is longer than the shared Balancer's TelemetryMaxAge (%s, balancer.Options.TelemetryMaxAge of the Balancer given to NewBuilder), after which a report is ignored as stale: %s or raise the Balancer's TelemetryMaxAge", interval, maxAge, shorten)
		}
	default:
		if maxAge := cmp.Or(c.opts.TelemetryMaxAge, core.DefaultTelemetryMaxAge); maxAge > 0 && c.oobInterval > maxAge {
			return nil, configError("orca.interval", "%s is longer than balancer.telemetryMaxAge (%s), after which a report is ignored as stale: %s or raise telemetryMaxAge", interval, maxAge, shorten)
		}
	}
	return c, nil
}

// MaxConfigEndpoints bounds the entries of a service config's "endpoints",
// and MaxConfigLabels the labels of one entry: a service config can come
// from the name resolver, which pushes it to every client.
const (
	MaxConfigEndpoints = 4096
	MaxConfigLabels    = 64
)

// parseEndpoints validates a config's "endpoints" and keys them by
// canonical address. Entries are read in address order, so that of two
// bad ones the same is reported every time.
func parseEndpoints(raw map[string]jsonEndpoint) (map[string]*endpointAttr, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	if len(raw) > MaxConfigEndpoints {
		return nil, configError("endpoints", "%d entries, more than MaxConfigEndpoints (%d)", len(raw), MaxConfigEndpoints)
	}
	out := make(map[string]*endpointAttr, len(raw))
	by := make(map[string]string, len(raw)) // canonical -> as written
	for _, addr := range slices.Sorted(maps.Keys(raw)) {
		e := raw[addr]
		field := fmt.Sprintf("endpoints[%q]", addr)
		key, ok := canonicalAddr(addr)
		if !ok {
			return nil, configError(field, "want an address as the resolver gives it, host:port with a port from 1 to 65535 (10.0.0.5:8000, [fd00::5]:8000, llm-0.llm.svc:8000)")
		}
		if prev, dup := by[key]; dup {
			return nil, configError(field, "the same address as endpoints[%q] (%s): each address may appear once", prev, key)
		}
		by[key] = addr
		if hasControl(e.ID) {
			return nil, configError(field+".id", "%q has control characters", e.ID)
		}
		if _, problem := core.CheckWeight(e.Weight); problem != "" {
			return nil, configError(field+".weight", "%s", strings.TrimPrefix(problem, "Weight "))
		}
		if len(e.Labels) > MaxConfigLabels {
			return nil, configError(field+".labels", "%d labels, more than MaxConfigLabels (%d)", len(e.Labels), MaxConfigLabels)
		}
		if _, empty := e.Labels[""]; empty {
			return nil, configError(field+".labels", "a label needs a name (\"model\", \"version\", \"dp_group\")")
		}
		// Names are matched exactly ("model", balancer.subsetLabel, a
		// Scorer's); one with a control character is a typo that no
		// reader would match. Values are free text, as Update takes
		// them: the core trims the spaces around each name of "model".
		for _, name := range slices.Sorted(maps.Keys(e.Labels)) {
			if hasControl(name) {
				return nil, configError(fmt.Sprintf("%s.labels[%q]", field, name), "a label name has no control characters")
			}
		}
		var labels map[string]string
		if len(e.Labels) > 0 {
			labels = maps.Clone(e.Labels)
		}
		out[key] = &endpointAttr{id: e.ID, weight: e.Weight, labels: labels}
	}
	return out, nil
}

// hasControl reports whether s has an ASCII control character (U+0000 to
// U+001F, or DEL).
func hasControl(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r < ' ' || r == 0x7f })
}

// MaxConfigStickyEntries bounds the sticky table a service config may ask
// for (balancer.stickyEntries): 1,048,576 entries, 32 MiB, which every
// channel of the policy allocates up front. A service config can come from
// the name resolver, which pushes it to every client; the core's own
// bound, balancer.MaxStickyEntries (512 MiB), is for a Balancer built in
// code (NewBuilder), as grpc-go caps ring_hash's ring size from a config.
const MaxConfigStickyEntries = 1 << 20

// options maps the tunables onto core.Options and validates them: each
// field alone first, so the error names the JSON field, then all together.
func (t *jsonTunables) options() (core.Options, error) {
	dur := func(src string, ptr func(*core.Options) *time.Duration) func(*core.Options) error {
		return func(o *core.Options) error {
			if src == "" {
				return nil
			}
			d, err := time.ParseDuration(src)
			if err != nil {
				return errors.New(durationProblem(src))
			}
			*ptr(o) = d
			return nil
		}
	}
	num := func(v float64, ptr func(*core.Options) *float64) func(*core.Options) error {
		return func(o *core.Options) error { *ptr(o) = v; return nil }
	}
	count := func(v int, ptr func(*core.Options) *int) func(*core.Options) error {
		return func(o *core.Options) error { *ptr(o) = v; return nil }
	}
	fields := []struct {
		name  string
		apply func(*core.Options) error
	}{
		{"telemetryMaxAge", dur(t.TelemetryMaxAge, func(o *core.Options) *time.Duration { return &o.TelemetryMaxAge })},
		{"latencyDecay", dur(t.LatencyDecay, func(o *core.Options) *time.Duration { return &o.LatencyDecay })},
		{"errorDecay", dur(t.ErrorDecay, func(o *core.Options) *time.Duration { return &o.ErrorDecay })},
		{"defaultCooldown", dur(t.DefaultCooldown, func(o *core.Options) *time.Duration { return &o.DefaultCooldown })},
		{"maxCooldown", dur(t.MaxCooldown, func(o *core.Options) *time.Duration { return &o.MaxCooldown })},
		{"notServedMemory", dur(t.NotServedMemory, func(o *core.Options) *time.Duration { return &o.NotServedMemory })},
		{"slowStartWindow", dur(t.SlowStartWindow, func(o *core.Options) *time.Duration { return &o.SlowStartWindow })},
		{"errorAlpha", num(t.ErrorAlpha, func(o *core.Options) *float64 { return &o.ErrorAlpha })},
		{"panicThreshold", num(t.PanicThreshold, func(o *core.Options) *float64 { return &o.PanicThreshold })},
		{"slowStartMinWeight", num(t.SlowStartMinWeight, func(o *core.Options) *float64 { return &o.SlowStartMinWeight })},
		{"slowStartAggression", num(t.SlowStartAggression, func(o *core.Options) *float64 { return &o.SlowStartAggression })},
		{"retryRatio", num(t.RetryRatio, func(o *core.Options) *float64 { return &o.RetryRatio })},
		{"retryFloor", num(t.RetryFloor, func(o *core.Options) *float64 { return &o.RetryFloor })},
		{"breakerFailures", count(t.BreakerFailures, func(o *core.Options) *int { return &o.BreakerFailures })},
		{"breakerProbes", count(t.BreakerProbes, func(o *core.Options) *int { return &o.BreakerProbes })},
		{"ejectionTime", dur(t.EjectionTime, func(o *core.Options) *time.Duration { return &o.EjectionTime })},
		{"maxEjectionTime", dur(t.MaxEjectionTime, func(o *core.Options) *time.Duration { return &o.MaxEjectionTime })},
		{"maxEjectedFraction", num(t.MaxEjectedFraction, func(o *core.Options) *float64 { return &o.MaxEjectedFraction })},
		{"outlierInterval", dur(t.OutlierInterval, func(o *core.Options) *time.Duration { return &o.OutlierInterval })},
		{"outlierMinRequests", count(t.OutlierMinRequests, func(o *core.Options) *int { return &o.OutlierMinRequests })},
		{"outlierMargin", num(t.OutlierMargin, func(o *core.Options) *float64 { return &o.OutlierMargin })},
	}
	mode := func(o *core.Options) error {
		if t.Affinity == "" {
			return nil
		}
		m, err := core.ParseAffinityMode(t.Affinity)
		if err != nil {
			return errors.New(strings.TrimPrefix(err.Error(), "inferlb: "))
		}
		o.Affinity = m
		return nil
	}
	fields = append(fields, []struct {
		name  string
		apply func(*core.Options) error
	}{
		{"affinity", mode},
		{"loadBound", num(t.LoadBound, func(o *core.Options) *float64 { return &o.LoadBound })},
		{"affinitySeed", func(o *core.Options) error { o.AffinitySeed = t.AffinitySeed; return nil }},
		{"tenantShardSize", func(o *core.Options) error { o.TenantShardSize = t.TenantShardSize; return nil }},
		{"spillMemory", dur(t.SpillMemory, func(o *core.Options) *time.Duration { return &o.SpillMemory })},
		{"minKeyReuse", num(t.MinKeyReuse, func(o *core.Options) *float64 { return &o.MinKeyReuse })},
		{"adapterHomes", num(t.AdapterHomes, func(o *core.Options) *float64 { return &o.AdapterHomes })},
		{"scanLimit", func(o *core.Options) error { o.ScanLimit = t.ScanLimit; return nil }},
		{"stickyTTL", dur(t.StickyTTL, func(o *core.Options) *time.Duration { return &o.StickyTTL })},
		{"stickyEntries", func(o *core.Options) error {
			if t.StickyEntries < 0 {
				// The core's own error gives its range, up to
				// MaxStickyEntries, which a service config may not ask for.
				return fmt.Errorf("%d must be in [0, %d] (0 means the default)", t.StickyEntries, MaxConfigStickyEntries)
			}
			if t.StickyEntries > MaxConfigStickyEntries {
				return fmt.Errorf("%d is over the %d a service config may ask for (a larger table: NewBuilder with your own Balancer's Options.StickyEntries)", t.StickyEntries, MaxConfigStickyEntries)
			}
			o.StickyEntries = t.StickyEntries
			return nil
		}},
	}...)
	var o core.Options
	for _, f := range fields {
		var one core.Options
		if err := f.apply(&one); err != nil {
			return o, configError("balancer."+f.name, "%v", err)
		}
		if err := one.Validate(); err != nil {
			return o, configError("balancer."+f.name, "%s", coreMessage(err))
		}
		_ = f.apply(&o)
	}
	o.SubsetLabel = t.SubsetLabel
	o.DPGroupLabel = t.DPGroupLabel
	if sub, dp := cmp.Or(o.SubsetLabel, core.DefaultSubsetLabel), cmp.Or(o.DPGroupLabel, core.DefaultDPGroupLabel); sub == dp {
		// The core's rule, named as the config names the field set.
		if o.SubsetLabel != "" {
			return o, configError("balancer.subsetLabel", "%q must differ from balancer.dpGroupLabel (%q): one label cannot list models and name engines", sub, dp)
		}
		return o, configError("balancer.dpGroupLabel", "%q must differ from balancer.subsetLabel (%q): one label cannot list models and name engines", dp, sub)
	}
	if t.TenantShardStrict { // a rule across fields: not in the list above
		if o.TenantShardSize == 0 {
			return o, configError("balancer.tenantShardStrict", "needs balancer.tenantShardSize > 0 (sharding is off)")
		}
		o.TenantShardStrict = true
	}
	// The core's rules across fields, named as the config names them (the
	// core's own error names its Options fields).
	for _, p := range []struct {
		limit, base string
		l, b        time.Duration
	}{
		{"maxCooldown", "defaultCooldown", o.MaxCooldown, o.DefaultCooldown},
		{"maxEjectionTime", "ejectionTime", o.MaxEjectionTime, o.EjectionTime},
	} {
		if p.l > 0 && p.b > p.l {
			return o, configError("balancer."+p.limit, "must be at least balancer.%s (%v)", p.base, p.b)
		}
	}
	if err := o.Validate(); err != nil {
		return o, configError("balancer", "%s", coreMessage(err))
	}
	return o, nil
}

// goHint is the core's note to Go callers in a duration's error; a
// service config's durations are strings with a unit, and a bare number
// is refused before the core sees it.
const goHint = " (a bare number is nanoseconds)"

// coreMessage is the core's Options error as a service config error
// reports it: without its prefix, or its hint for Go callers.
func coreMessage(err error) string {
	return strings.Replace(strings.TrimPrefix(err.Error(), "inferlb: "), goHint, "", 1)
}

// canonical returns t with each duration and the affinity mode written
// as o, the Options t parsed into, has them: one spelling for one value
// ("1s" for "1000ms", "strict" for "Strict", "" for "0s" and for the
// default mode), so that a config written otherwise compares equal and
// keeps the policy's Balancer and its live state.
func (t *jsonTunables) canonical(o *core.Options) jsonTunables {
	c := *t
	for _, d := range []struct {
		dst *string
		v   time.Duration
	}{
		{&c.TelemetryMaxAge, o.TelemetryMaxAge}, {&c.LatencyDecay, o.LatencyDecay},
		{&c.ErrorDecay, o.ErrorDecay}, {&c.DefaultCooldown, o.DefaultCooldown},
		{&c.MaxCooldown, o.MaxCooldown}, {&c.SlowStartWindow, o.SlowStartWindow},
		{&c.EjectionTime, o.EjectionTime}, {&c.MaxEjectionTime, o.MaxEjectionTime},
		{&c.OutlierInterval, o.OutlierInterval}, {&c.SpillMemory, o.SpillMemory},
		{&c.StickyTTL, o.StickyTTL}, {&c.NotServedMemory, o.NotServedMemory},
	} {
		*d.dst = ""
		if d.v != 0 {
			*d.dst = d.v.String()
		}
	}
	c.Affinity = ""
	if o.Affinity != 0 {
		c.Affinity = o.Affinity.String()
	}
	return c
}

// duplicateKey returns an error naming the first key that one of js's
// objects repeats, or nil. encoding/json keeps a repeated key's last value
// (and merges a repeated object into the first), so a method, an endpoint,
// a label or a tunable named twice would take whichever came last,
// silently. Field names repeat when they match as encoding/json matches
// them, case-insensitively; the keys of "methods", "endpoints" and an
// endpoint's "labels" only when equal, as gRPC compares method names and
// the balancer labels (two spellings of one address are parseEndpoints'
// to find). js has decoded into jsonConfig already, so it is valid JSON
// of the schema's shape.
func duplicateKey(js []byte) error {
	dec := json.NewDecoder(bytes.NewReader(js))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil // not an object: Decode said what is wrong
	}
	return duplicateIn(dec, "", objFields)
}

// objKind is what the keys of an object of the schema are.
type objKind int

const (
	objFields  objKind = iota // field names of the top level or a section
	objEntry                  // field names of an "endpoints" entry
	objScalars                // names (methods, labels) of string values
	objEntries                // addresses ("endpoints") of entries
)

// duplicateIn reads the rest of an object whose '{' dec has just read, at
// path ("" for the top level), whose keys are of kind. No field of the
// schema is an array, so a value is an object or a scalar.
func duplicateIn(dec *json.Decoder, path string, kind objKind) error {
	seen := map[string]string{} // key as compared -> key as first written
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		key, _ := tok.(string)
		var field string
		child := objFields
		if kind == objScalars || kind == objEntries {
			field = fmt.Sprintf("%s[%q]", path, key)
			if _, ok := seen[key]; ok {
				what := "method"
				switch {
				case kind == objEntries:
					what = "address"
				case strings.HasSuffix(path, ".labels"):
					what = "label"
				}
				return configError(field, "duplicate key: each %s may appear once", what)
			}
			seen[key] = key
			if kind == objEntries {
				child = objEntry
			}
		} else {
			// encoding/json's fold: "IDBYHOST", "methodſ" (long s) and
			// "brea\u212aerFailures" (Kelvin sign) all match their field.
			cmp := strings.ToLower(strings.ToUpper(key))
			first, ok := seen[cmp]
			if !ok {
				first = key
				seen[cmp] = key
			}
			field = first
			if path != "" {
				field = path + "." + first
			}
			switch {
			case ok && first == key:
				return configError(field, "duplicate key: each field may appear once")
			case ok:
				return configError(field, "duplicate key %q: each field may appear once, and field names match case-insensitively", key)
			}
			switch {
			case kind == objFields && path == "" && cmp == "methods", kind == objEntry && cmp == "labels":
				child = objScalars
			case kind == objFields && path == "" && cmp == "endpoints":
				child = objEntries
			}
		}
		if tok, err = dec.Token(); err != nil {
			return nil
		}
		if tok == json.Delim('{') {
			if err := duplicateIn(dec, field, child); err != nil {
				return err
			}
		}
	}
	_, _ = dec.Token() // '}'
	return nil
}

// validKey reports whether k (lower-cased) is a valid HTTP/2 header name
// for gRPC metadata: 0-9 a-z - _ . (grpc-go's own check is internal).
func validKey(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// parseDuration reads a Go duration ("1.5s", "250ms"), which also covers
// the protobuf JSON form of google.protobuf.Duration ("1.5s").
func parseDuration(field, s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, configError(field, "%s", durationProblem(s))
	}
	return d, nil
}

// wellFormedDuration matches a duration written as time.ParseDuration
// reads one (an optional sign, then numbers, decimal fractions allowed,
// each with a unit), whatever its size.
var wellFormedDuration = regexp.MustCompile(`^[-+]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h))+$`)

// durationProblem says what is wrong with s, which time.ParseDuration
// refused: a duration past time.Duration's range ("3000000h") is written
// correctly and must not be told it is no duration.
func durationProblem(s string) string {
	if wellFormedDuration.MatchString(s) {
		return fmt.Sprintf("%q is out of range: a duration may be at most %v (about 292 years)", s, time.Duration(math.MaxInt64))
	}
	return fmt.Sprintf("%q is not a duration such as \"1.5s\" or \"250ms\"", s)
}

// decodeError rewrites encoding/json's errors so they carry the prefix and
// name the field.
func decodeError(js []byte, err error) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			field = "(top level)"
		}
		if field == "methods" {
			field = badMethod(js) // a value in the map, or the map
		}
		if field == "endpoints" || strings.HasPrefix(field, "endpoints.") {
			field = badEndpoint(js, field) // an entry, or the map
		}
		// A number of the wrong kind (2.5 for a count) or one that does
		// not fit (1e30 for a count, 1e400 for any field).
		if num, ok := strings.CutPrefix(typeErr.Value, "number "); ok {
			if f, err := strconv.ParseFloat(num, 64); err != nil || math.Abs(f) >= 1<<63 {
				return configError(field, "JSON number %s is out of range%s", num, kindRange(typeErr.Type.Kind().String()))
			}
		}
		return configError(field, "got JSON %s, want %s", typeErr.Value, jsonKind(typeErr.Type.Kind().String()))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("inferlb: service config: invalid JSON: unexpected end of input")
	case errors.As(err, &syntaxErr):
		return fmt.Errorf("inferlb: service config: invalid JSON at offset %d: %v", syntaxErr.Offset, err)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		key, _ := strconv.Unquote(strings.TrimPrefix(err.Error(), "json: unknown field "))
		path := unknownFieldPath(js, key)
		if entry, ok := strings.CutSuffix(path, "."+key); ok && strings.HasPrefix(entry, "endpoints[") {
			// The entry's address, quoted inside a quoted path, would
			// come out in backslashes.
			return configError(entry, "unknown field %q (want id, weight or labels)", key)
		}
		return fmt.Errorf("inferlb: service config: unknown field %q", path)
	}
	return fmt.Errorf("inferlb: service config: %v", err)
}

// kindRange says, for an out-of-range number's error, the most a field of
// Go kind k can hold; the field's own bounds, checked after decoding, may
// be narrower (balancer.Options documents them).
func kindRange(k string) string {
	switch k {
	case "uint64":
		return " (an integer from 0 to 2^64-1)"
	case "int", "int64":
		return " (an integer, at most 2^63-1; the field's own bound may be lower)"
	case "float64":
		return " (a number, at most about 1.8e308; the field's own bound may be lower)"
	}
	return ""
}

// badMethod names the first entry of js's "methods" whose value is not a
// string, as methods["/pkg.Svc/M"]: encoding/json's error names the map
// alone. It returns "methods" when it finds none, or "methods" is no object.
func badMethod(js []byte) string {
	var top struct {
		Methods map[string]json.RawMessage `json:"methods"`
	}
	if json.Unmarshal(js, &top) != nil {
		return "methods"
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	for { // in the order written, not the map's
		tok, err := dec.Token()
		if err != nil {
			return "methods"
		}
		key, ok := tok.(string)
		if !ok {
			continue
		}
		if raw, ok := top.Methods[key]; ok {
			var v string
			if json.Unmarshal(raw, &v) != nil {
				return fmt.Sprintf("methods[%q]", key)
			}
		}
	}
}

// badEndpoint names the first entry of js's "endpoints", in the order
// written, that does not decode, as endpoints["10.0.0.5:8000"] followed
// by the rest of field (".weight"): encoding/json's error names no map
// key. It returns field when it finds none.
func badEndpoint(js []byte, field string) string {
	var top struct {
		Endpoints json.RawMessage `json:"endpoints"`
	}
	if json.Unmarshal(js, &top) != nil || len(top.Endpoints) == 0 {
		return field
	}
	dec := json.NewDecoder(bytes.NewReader(top.Endpoints))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return field // not an object: the map itself is wrong
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return field
		}
		addr, _ := tok.(string)
		var raw json.RawMessage
		if dec.Decode(&raw) != nil {
			return field
		}
		var e jsonEndpoint
		if json.Unmarshal(raw, &e) != nil {
			rest := strings.TrimPrefix(field, "endpoints")
			if rest == ".labels" {
				rest += badLabel(raw)
			}
			return fmt.Sprintf("endpoints[%q]", addr) + rest
		}
	}
	return field
}

// badLabel names the first label of the endpoint entry raw, in the order
// written, whose value is not a string, as ["model"]; "" when there is
// none, or "labels" is no object (the map itself is wrong).
func badLabel(raw json.RawMessage) string {
	var e struct {
		Labels json.RawMessage `json:"labels"` // matched as jsonEndpoint's is
	}
	if json.Unmarshal(raw, &e) != nil || len(e.Labels) == 0 {
		return ""
	}
	dec := json.NewDecoder(bytes.NewReader(e.Labels))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return ""
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		name, _ := tok.(string)
		var v json.RawMessage
		if dec.Decode(&v) != nil {
			return ""
		}
		var s string
		if json.Unmarshal(v, &s) != nil {
			return fmt.Sprintf("[%q]", name)
		}
	}
	return ""
}

// unknownFieldPath names the section an unknown field is in ("orca.oob"):
// encoding/json's error names the key alone. A section counts only when
// the unknown field it has is key itself: the config may have other
// unknown fields after the one reported (a tunable written at the top level,
// and a misspelt one in "balancer"), and naming key in a section that
// merely has some other unknown field would send the reader to the wrong
// place, even to a field that exists ("balancer.slowStartWindow").
func unknownFieldPath(js []byte, key string) string {
	var top struct {
		ORCA      json.RawMessage            `json:"orca"`
		Balancer  json.RawMessage            `json:"balancer"`
		Endpoints map[string]json.RawMessage `json:"endpoints"`
	}
	if json.Unmarshal(js, &top) != nil {
		return key
	}
	for _, addr := range slices.Sorted(maps.Keys(top.Endpoints)) {
		dec := json.NewDecoder(bytes.NewReader(top.Endpoints[addr]))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&jsonEndpoint{}); err != nil && err.Error() == "json: unknown field "+strconv.Quote(key) {
			return fmt.Sprintf("endpoints[%q].%s", addr, key)
		}
	}
	sections := []struct {
		name string
		raw  json.RawMessage
		into any
	}{{"orca", top.ORCA, &jsonORCA{}}, {"balancer", top.Balancer, &jsonTunables{}}}
	for _, sec := range sections {
		if len(sec.raw) == 0 {
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(sec.raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(sec.into); err != nil && err.Error() == "json: unknown field "+strconv.Quote(key) {
			return sec.name + "." + key
		}
	}
	return key
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "map", "struct":
		return "an object"
	case "slice", "array":
		return "an array"
	case "uint64":
		return "a non-negative integer"
	case "int", "int8", "int16", "int32", "int64":
		return "an integer"
	}
	return "a number"
}
