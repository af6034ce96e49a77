package main

import (
	"crypto/sha256"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/idemhttp"
)

// Targets (on PostgreSQL): idem's first execution may cost at most 15% of
// the bare handler's throughput; a replay must be at least 5 times as fast
// with the replay cache, 2.5 times without it.
const (
	targetFirst         = 0.85
	targetReplayCached  = 5.0
	targetReplayNoCache = 2.5
)

// Routes. /idem and /idemnc share one scope (Config.Route), so the cache-off
// middleware replays the keys /idem executed, from the database.
const (
	pathBare    = "/bare/payments"
	pathIdem    = "/idem/payments"
	pathNoCache = "/idemnc/payments"
	pathGeneric = "/generic/payments"
	pathNaive   = "/naive/payments"
	pathFloor   = "/floor/payments"
	// pathFloorNoRead is scenario y, pathFloor without the read.
	pathFloorNoRead = "/floorw/payments"
	// pathIdem2 is a second idem instance (its own pool and middleware)
	// on the same schema, for the duplicates experiment.
	pathIdem2 = "/idem2/payments"
	// The same through PgBouncer (-pgbouncer): its own pools, drivers and
	// middlewares, on the same schema.
	pathPgbBare    = "/pgb/bare/payments"
	pathPgbIdem    = "/pgb/idem/payments"
	pathPgbNoCache = "/pgb/idemnc/payments"
	pathPgbIdem2   = "/pgb/idem2/payments"
)

// scenarioSet builds scenarios with fresh and replayed keys.
type scenarioSet struct {
	runID string
	// keys is the shape of the keys (-keys): "seq" is runID-route-n, whose
	// common prefix and counter put every new key into the same few index
	// pages; "uuid" random-looking UUIDv4 strings, as most clients send
	// them; "uuid7" UUIDv7 strings, as idemclient sends them.
	keys string
	// start is the UUIDv7 keys' first millisecond: command n's key carries
	// start+n, so that the keys grow with n, as time-ordered keys do.
	start int64
}

// key returns the Idempotency-Key of command n on route. The UUID shapes
// are derived from runID-route-n, so that a replay sends the same key
// again.
func (s scenarioSet) key(route string, n int64) string {
	k := fmt.Sprintf("%s-%s-%d", s.runID, route, n)
	if s.keys == "seq" || s.keys == "" {
		return k
	}
	h := sha256.Sum256([]byte(k))
	if s.keys == "uuid7" {
		ms := uint64(s.start + n)
		h[0], h[1], h[2], h[3], h[4], h[5] = byte(ms>>40), byte(ms>>32), byte(ms>>24), byte(ms>>16), byte(ms>>8), byte(ms)
		h[6] = h[6]&0x0f | 0x70 // version 7
	} else {
		h[6] = h[6]&0x0f | 0x40 // version 4
	}
	h[8] = h[8]&0x3f | 0x80 // RFC 9562 variant
	return uuid.UUID(h[:16]).String()
}

func newScenarioSet(runID, keys string) scenarioSet {
	return scenarioSet{runID: runID, keys: keys, start: time.Now().UnixMilli()}
}

func (s scenarioSet) fresh(route string) func(*rand.Rand) request {
	var seq atomic.Int64
	return func(*rand.Rand) request {
		n := seq.Add(1)
		return request{n: n, key: s.key(route, n), body: paymentBody(n)}
	}
}

// executed collects the commands a first-execution scenario completed, for
// its replay scenarios, which send them again picked at random.
type executed struct {
	mu sync.Mutex
	ns []int64
}

func (e *executed) record(req request) {
	e.mu.Lock()
	e.ns = append(e.ns, req.n)
	e.mu.Unlock()
}

func (s scenarioSet) replay(route string, from *executed) func(*rand.Rand) request {
	return s.replayRecent(route, from, 0)
}

// replayRecent replays one of the last recent commands executed (0: any).
func (s scenarioSet) replayRecent(route string, from *executed, recent int) func(*rand.Rand) request {
	return func(rng *rand.Rand) request {
		from.mu.Lock()
		lo := 0
		if recent > 0 {
			lo = max(len(from.ns)-recent, 0)
		}
		n := from.ns[lo+rng.IntN(len(from.ns)-lo)]
		from.mu.Unlock()
		return request{n: n, key: s.key(route, n), body: paymentBody(n)}
	}
}

func created(status int, h http.Header) bool {
	return status == http.StatusCreated && h.Get(idemhttp.ReplayedHeader) == ""
}

func replayed(status int, h http.Header) bool {
	return status == http.StatusCreated && h.Get(idemhttp.ReplayedHeader) == "true"
}

// scenarios returns the PostgreSQL scenarios in table order, with pa, pb
// and pe (a, b and e through PgBouncer, their ratios to pa) when pooled;
// only, if not empty, keeps a and pa (the baselines) and the listed ids.
func scenarios(runID string, only string, pooled bool, keys string) ([]*scenario, error) {
	set := newScenarioSet(runID, keys)
	var idemDone, genericDone, naiveDone, pgbDone executed
	scs := []*scenario{
		{id: "a", name: "bare (no idem)", path: pathBare, next: set.fresh("bare"), ok: created},
		{id: "b", name: "idem first execution", path: pathIdem, next: set.fresh("idem"), ok: created,
			done: idemDone.record, target: targetFirst},
		{id: "c", name: "idem replay, cache on", path: pathIdem, next: set.replay("idem", &idemDone), ok: replayed,
			replays: "b", target: targetReplayCached},
		// Retries come soon after the first attempt: the last 10,000 keys.
		{id: "r", name: "idem replay of a recent key, cache on", path: pathIdem, next: set.replayRecent("idem", &idemDone, 10000),
			ok: replayed, replays: "b", info: true},
		{id: "e", name: "idem replay, cache off", path: pathNoCache, next: set.replay("idem", &idemDone), ok: replayed,
			replays: "b", target: targetReplayNoCache},
		{id: "f", name: "generic path first (before)", path: pathGeneric, next: set.fresh("generic"), ok: created,
			done: genericDone.record, info: true},
		{id: "g", name: "generic path replay (before)", path: pathGeneric, next: set.replay("generic", &genericDone), ok: replayed,
			replays: "f", info: true},
		// The database work any design that stores the response with the
		// effect must do, and nothing more, with the record read first
		// (z) and without (y, which would run the handler for a replay):
		// see floorHandler.
		{id: "z", name: "floor: read, effect, record", path: pathFloor, next: set.fresh("floor"), ok: created, info: true},
		{id: "y", name: "floor without the read", path: pathFloorNoRead, next: set.fresh("floorw"), ok: created, info: true},
		{id: "d", name: "naive interceptor", path: pathNaive, next: set.fresh("naive"), ok: created,
			done: naiveDone.record},
		// The naive interceptor's replay: one SELECT by key, no lock (and no
		// replay header: any 201 is its stored answer).
		{id: "n", name: "naive interceptor replay", path: pathNaive, next: set.replay("naive", &naiveDone),
			ok: func(status int, _ http.Header) bool { return status == http.StatusCreated }, replays: "d", info: true},
	}
	if pooled {
		scs = append(scs,
			&scenario{id: "pa", name: "bare via PgBouncer", path: pathPgbBare, next: set.fresh("pgbbare"), ok: created, base: "pa"},
			&scenario{id: "pb", name: "idem first execution via PgBouncer", path: pathPgbIdem, next: set.fresh("pgbidem"), ok: created,
				done: pgbDone.record, target: targetFirst, base: "pa"},
			&scenario{id: "pe", name: "idem replay, cache off, via PgBouncer", path: pathPgbNoCache, next: set.replay("pgbidem", &pgbDone),
				ok: replayed, replays: "pb", target: targetReplayNoCache, base: "pa"},
		)
	}
	if only == "" {
		return scs, nil
	}

	keep := map[string]bool{"a": true}
	if pooled {
		keep["pa"] = true
	}
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
