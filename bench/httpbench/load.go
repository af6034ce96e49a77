package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/idemhttp"
)

// request is one request a scenario sends.
type request struct {
	n    int64 // command number: the body is paymentBody(n)
	key  string
	body []byte
}

// scenario is one way of serving the command, with the requests that
// exercise it.
type scenario struct {
	id   string // a, b, c, ...
	name string
	path string
	info bool // measured for comparison only (no target)
	// replays is the id of the scenario whose executed keys this one
	// sends again.
	replays string
	// target is the least ratio to its baseline this scenario should
	// reach (0: none).
	target float64
	// base is the id of the baseline its ratio is to: "" is the table's
	// first scenario (a); "pa" for the scenarios through PgBouncer.
	base string
	// next returns the request a client sends next.
	next func(rng *rand.Rand) request
	// ok reports whether the answer is the expected one.
	ok func(status int, h http.Header) bool
	// done, if set, is told about every request answered as expected.
	done func(req request)
	runs []runResult
}

// runResult is one round of a scenario: the sum of its slices.
type runResult struct {
	requests  int
	failures  int
	firstFail string
	elapsed   time.Duration
	rps       float64
	p50, p99  time.Duration
	rtPerReq  float64
	stmPerReq float64
	walPerReq float64
	goCPU     time.Duration // this process (server and clients) per request
	pgCPU     time.Duration // the pool's PostgreSQL backends per request
}

// tally adds up the slices of one scenario in one round.
type tally struct {
	lats      []time.Duration
	failures  int
	firstFail string
	elapsed   time.Duration
	db        counts
	wal       float64
	goCPU     time.Duration
	pgCPU     time.Duration
}

func (t *tally) add(s sample, db counts, wal float64, goCPU, pgCPU time.Duration) {
	t.goCPU += goCPU
	t.pgCPU += pgCPU
	t.lats = append(t.lats, s.lats...)
	t.failures += s.failures
	if t.firstFail == "" {
		t.firstFail = s.firstFail
	}
	t.elapsed += s.elapsed
	t.db.roundTrips += db.roundTrips
	t.db.statements += db.statements
	t.wal += wal
}

func (t *tally) result() runResult {
	slices.Sort(t.lats)
	r := runResult{
		requests:  len(t.lats),
		failures:  t.failures,
		firstFail: t.firstFail,
		elapsed:   t.elapsed,
		p50:       percentile(t.lats, 0.50),
		p99:       percentile(t.lats, 0.99),
	}
	if n := float64(len(t.lats)); n > 0 {
		// Throughput counts the answers the scenario expects only: fast
		// failures must not make a scenario look faster.
		r.rps = float64(len(t.lats)-t.failures) / t.elapsed.Seconds()
		r.rtPerReq = float64(t.db.roundTrips) / n
		r.stmPerReq = float64(t.db.statements) / n
		r.walPerReq = t.wal / n
		r.goCPU = t.goCPU / time.Duration(len(t.lats))
		r.pgCPU = t.pgCPU / time.Duration(len(t.lats))
	}
	return r
}

// sample is what the clients saw during one slice.
type sample struct {
	lats      []time.Duration
	failures  int
	firstFail string
	elapsed   time.Duration // from the first request sent to the last answer
}

// load drives sc with clients closed-loop HTTP clients for d: a client
// sends its next request when the previous one is answered, until d is
// over; requests in flight then finish and count.
func load(ctx context.Context, hc *http.Client, baseURL string, sc *scenario, clients int, d time.Duration) sample {
	ws := make([]worker, clients)
	current.Store(&sc.id)
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for i := range ws {
		wg.Add(1)
		go func(w *worker, seed uint64) {
			defer wg.Done()
			pprof.SetGoroutineLabels(pprof.WithLabels(ctx, pprof.Labels("scenario", sc.id)))
			rng := rand.New(rand.NewPCG(seed, uint64(start.UnixNano())))
			for ctx.Err() == nil && time.Now().Before(deadline) {
				req := sc.next(rng)
				t0 := time.Now()
				status, h, body, err := send(ctx, hc, baseURL+sc.path, req)
				w.lats = append(w.lats, time.Since(t0))
				switch {
				case err != nil:
					w.fail(fmt.Sprintf("transport: %v", err))
				case !sc.ok(status, h):
					w.fail(fmt.Sprintf("status %d: %.120s", status, body))
				case sc.done != nil:
					sc.done(req)
				}
			}
		}(&ws[i], uint64(i))
	}
	wg.Wait()
	s := sample{elapsed: time.Since(start)}
	for _, w := range ws {
		s.lats = append(s.lats, w.lats...)
		s.failures += w.failures
		if s.firstFail == "" {
			s.firstFail = w.firstFail
		}
	}
	return s
}

// worker is what one load client saw.
type worker struct {
	lats      []time.Duration
	failures  int
	firstFail string
}

func (w *worker) fail(msg string) {
	w.failures++
	if w.firstFail == "" {
		w.firstFail = msg
	}
}

// send POSTs req and returns the answer.
func send(ctx context.Context, hc *http.Client, url string, req request) (int, http.Header, []byte, error) {
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(req.body))
	if err != nil {
		return 0, nil, nil, err
	}
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set(idemhttp.KeyHeader, req.key)
	resp, err := hc.Do(r)
	if err != nil {
		return 0, nil, nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, body, err
}

// percentile of sorted durations (nearest rank).
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// median of xs (the mean of the two middle values for an even count).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// current is the scenario being driven: a CPU profile's samples are
// labelled with it ("scenario"), server side too, since scenarios take
// turns.
var current atomic.Pointer[string]

func labelled(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := current.Load(); id != nil {
			pprof.SetGoroutineLabels(pprof.WithLabels(r.Context(), pprof.Labels("scenario", *id)))
		}
		h.ServeHTTP(w, r)
	})
}
