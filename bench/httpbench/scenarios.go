package main

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/idemkit/idem/idemhttp"
)

// Targets: idem's first execution may cost at most 15% of the bare
// handler's throughput, and a replay must be at least twice as fast.
const (
	targetFirst  = 0.85
	targetReplay = 2.0
)

// variant is one prototype driver, served on its own route and measured as
// two scenarios (first execution, replay).
type variant struct {
	features map[string]bool
	path     string
	first    string // scenario ids
	replay   string
}

// newVariants names the routes and scenario ids of the -proto variants:
// e and f for the first, g and h for the second, and so on.
func newVariants(fss []map[string]bool) []variant {
	vs := make([]variant, len(fss))
	for i, fs := range fss {
		vs[i] = variant{
			features: fs,
			path:     fmt.Sprintf("/proto%d/payments", i+1),
			first:    string(rune('e' + 2*i)),
			replay:   string(rune('f' + 2*i)),
		}
	}
	return vs
}

// scenarios returns the scenarios in table order; only, if not empty, keeps
// a (the baseline) and the listed ids.
func scenarios(runID string, vs []variant, only string) ([]*scenario, error) {
	fresh := func(route string) func(*rand.Rand) request {
		var seq atomic.Int64
		return func(*rand.Rand) request {
			n := seq.Add(1)
			return request{n: n, key: fmt.Sprintf("%s-%s-%d", runID, route, n), body: paymentBody(n)}
		}
	}
	created := func(status int, h http.Header) bool {
		return status == http.StatusCreated && h.Get(idemhttp.ReplayedHeader) == ""
	}
	replayed := func(status int, h http.Header) bool {
		return status == http.StatusCreated && h.Get(idemhttp.ReplayedHeader) == "true"
	}
	// A first-execution scenario records the commands it completed; its
	// replay scenario sends them again, picked at random.
	type executed struct {
		mu sync.Mutex
		ns []int64
	}
	record := func(e *executed) func(request) {
		return func(req request) {
			e.mu.Lock()
			e.ns = append(e.ns, req.n)
			e.mu.Unlock()
		}
	}
	replay := func(route string, from *executed) func(*rand.Rand) request {
		return func(rng *rand.Rand) request {
			from.mu.Lock()
			n := from.ns[rng.IntN(len(from.ns))]
			from.mu.Unlock()
			return request{n: n, key: fmt.Sprintf("%s-%s-%d", runID, route, n), body: paymentBody(n)}
		}
	}

	var idemDone executed
	scs := []*scenario{
		{id: "a", name: "bare (no idem)", path: "/bare/payments", next: fresh("bare"), ok: created},
		{id: "b", name: "idem first execution", path: "/idem/payments", next: fresh("idem"), ok: created,
			done: record(&idemDone), target: targetFirst},
		{id: "c", name: "idem replay", path: "/idem/payments", next: replay("idem", &idemDone), ok: replayed,
			replays: "b", target: targetReplay},
		{id: "d", name: "naive interceptor", path: "/naive/payments", next: fresh("naive"), ok: created},
	}
	for _, v := range vs {
		var done executed
		route := strings.Trim(strings.TrimSuffix(v.path, "/payments"), "/")
		label := protoLabel(v.features)
		scs = append(scs,
			&scenario{id: v.first, name: "idem first, proto " + label, path: v.path, proto: true,
				next: fresh(route), ok: created, done: record(&done), target: targetFirst},
			&scenario{id: v.replay, name: "idem replay, proto " + label, path: v.path, proto: true,
				next: replay(route, &done), ok: replayed, replays: v.first, target: targetReplay},
		)
	}
	if only == "" {
		return scs, nil
	}

	keep := map[string]bool{"a": true}
	for id := range strings.SplitSeq(only, ",") {
		keep[strings.TrimSpace(id)] = true
	}
	var kept []*scenario
	for _, sc := range scs {
		if keep[sc.id] {
			kept = append(kept, sc)
			delete(keep, sc.id)
		}
	}
	if len(keep) > 0 {
		return nil, fmt.Errorf("-scenarios: unknown ids %v", slices.Sorted(maps.Keys(keep)))
	}
	for _, sc := range kept {
		if sc.replays != "" && !slices.ContainsFunc(kept, func(p *scenario) bool { return p.id == sc.replays }) {
			return nil, fmt.Errorf("-scenarios: %s replays the keys %s executes: keep both", sc.id, sc.replays)
		}
	}
	return kept, nil
}
