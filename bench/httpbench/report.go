package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/pgbouncer"
)

// conditions describes the machine and the settings of the run.
func conditions(ctx context.Context, pool *pgxpool.Pool, o options, bnc *pgbouncer.Process) (string, error) {
	var version, syncCommit, fsync string
	err := pool.QueryRow(ctx, `SELECT current_setting('server_version'),
		current_setting('synchronous_commit'), current_setting('fsync')`).Scan(&version, &syncCommit, &fsync)
	if err != nil {
		return "", fmt.Errorf("server settings: %w", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "conditions: %s %s/%s, GOMAXPROCS=%d (NumCPU=%d), PostgreSQL %s, synchronous_commit=%s, fsync=%s\n",
		runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0), runtime.NumCPU(), version, syncCommit, fsync)
	fmt.Fprintf(&b, "            load average at start %s (server, clients and PostgreSQL share these CPUs with whatever else runs)\n", loadAvg())
	fmt.Fprintf(&b, "            clients=%d (closed loop, HTTP/1.1 keep-alive over loopback), pool=%d conns, duration=%s per scenario x %d rounds,\n",
		o.clients, o.conns, o.duration, o.rounds)
	fmt.Fprintf(&b, "            scenarios interleaved in %s slices (random order), warm-up %s per scenario,\n", o.slice, o.warmup)
	fmt.Fprintf(&b, "            keys=%s, records in idem's table before the run: %d", o.keys, o.records)
	if bnc != nil {
		fmt.Fprintf(&b, ",\n            pa, pb, pe: through %s, pool_mode=transaction, %d server connections, in front of the same server;\n",
			bnc.Version, o.conns)
		fmt.Fprintf(&b, "            their pools: %d conns each, QueryExecModeCacheDescribe (no statement prepared across transactions), search_path by connect_query", o.conns)
	}
	return b.String(), nil
}

// printTable prints the medians over rounds and the targets. It returns
// an error when requests failed: the ratios are then not valid.
func printTable(w io.Writer, scs []*scenario) error {
	baseOf := func(sc *scenario) *scenario {
		for _, b := range scs {
			if sc.base != "" && b.id == sc.base {
				return b
			}
		}
		return scs[0]
	}
	ratios := func(sc *scenario) []float64 {
		base := baseOf(sc)
		rs := make([]float64, len(sc.runs))
		for i := range sc.runs {
			rs[i] = sc.runs[i].rps / base.runs[i].rps
		}
		return rs
	}
	med := func(sc *scenario, f func(runResult) float64) float64 {
		xs := make([]float64, len(sc.runs))
		for i, r := range sc.runs {
			xs[i] = f(r)
		}
		return median(xs)
	}
	ms := func(d float64) string { return fmt.Sprintf("%.2fms", d/float64(time.Millisecond)) }
	us := func(d float64) string { return fmt.Sprintf("%.0fus", d/float64(time.Microsecond)) }

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\t\trequests\treq/s\tp50\tp99\tratio to a\t(min..max)\tRT/req\tstmt/req\tWAL B/req\tGo CPU/req\tPG CPU/req\tfailed\t")
	var notes []string
	for _, sc := range scs {
		total, failed := 0, 0
		for _, r := range sc.runs {
			total += r.requests
			failed += r.failures
			if r.firstFail != "" && len(notes) < 8 {
				notes = append(notes, fmt.Sprintf("%s: %s", sc.id, r.firstFail))
			}
		}
		rs := ratios(sc)
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%s\t%s\t%.2f\t(%.2f..%.2f)\t%.2f\t%.2f\t%.0f\t%s\t%s\t%d\t\n",
			sc.id, sc.name+" ", total,
			med(sc, func(r runResult) float64 { return r.rps }),
			ms(med(sc, func(r runResult) float64 { return float64(r.p50) })),
			ms(med(sc, func(r runResult) float64 { return float64(r.p99) })),
			median(rs), slices.Min(rs), slices.Max(rs),
			med(sc, func(r runResult) float64 { return r.rtPerReq }),
			med(sc, func(r runResult) float64 { return r.stmPerReq }),
			med(sc, func(r runResult) float64 { return r.walPerReq }),
			us(med(sc, func(r runResult) float64 { return float64(r.goCPU) })),
			us(med(sc, func(r runResult) float64 { return float64(r.pgCPU) })),
			failed)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "requests: all rounds; other columns: median over rounds; ratio: median of the per-round ratios to a")
	fmt.Fprintln(w, "RT: round trips to PostgreSQL; WAL: cluster-wide; Go CPU: this process (HTTP clients included); PG CPU: the pool's backends")
	if slices.ContainsFunc(scs, func(sc *scenario) bool { return sc.base != "" }) {
		fmt.Fprintln(w, "p*: through PgBouncer (transaction mode), ratios to pa, the bare handler through it; PG CPU: PgBouncer's server connections and PgBouncer")
		fmt.Fprintln(w, "    RT and stmt leave out what pgdriver sends on the raw connection (pgconn), unseen by pgx's tracer: pe's ROLLBACK, one more of each")
		// What PgBouncer costs each path: a p* scenario against its
		// direct twin, round by round.
		var vs []string
		for _, p := range scs {
			i := slices.IndexFunc(scs, func(d *scenario) bool { return p.base != "" && "p"+d.id == p.id })
			if i < 0 {
				continue
			}
			d := scs[i]
			rs := make([]float64, len(p.runs))
			for r := range p.runs {
				rs[r] = p.runs[r].rps / d.runs[r].rps
			}
			vs = append(vs, fmt.Sprintf("%s/%s %.2f (%.2f..%.2f)", p.id, d.id, median(rs), slices.Min(rs), slices.Max(rs)))
		}
		if len(vs) > 0 {
			fmt.Fprintln(w, "through PgBouncer vs direct (throughput, median of per-round ratios):", strings.Join(vs, ", "))
		}
	}
	// idem's first execution against the floor (scenario z), round by
	// round: how much of what the database work alone allows idem keeps.
	if bi, zi := slices.IndexFunc(scs, func(sc *scenario) bool { return sc.id == "b" }),
		slices.IndexFunc(scs, func(sc *scenario) bool { return sc.id == "z" }); bi >= 0 && zi >= 0 {
		b, z := scs[bi], scs[zi]
		rs := make([]float64, len(b.runs))
		for r := range b.runs {
			rs[r] = b.runs[r].rps / z.runs[r].rps
		}
		fmt.Fprintf(w, "idem's first execution vs the floor (informative): b/z %.2f (%.2f..%.2f)\n", median(rs), slices.Min(rs), slices.Max(rs))
	}
	for _, n := range notes {
		fmt.Fprintln(w, "failure:", n)
	}
	fmt.Fprintln(w)

	failedIn := func(sc *scenario) int {
		n := 0
		for _, r := range sc.runs {
			n += r.failures
		}
		return n
	}
	var invalid []string
	for _, sc := range scs {
		if n := failedIn(sc); n > 0 {
			invalid = append(invalid, fmt.Sprintf("%s (%d)", sc.id, n))
		}
	}
	for _, sc := range scs {
		if sc.target == 0 {
			continue
		}
		got := median(ratios(sc))
		verdict := "MISS"
		switch {
		case failedIn(sc) > 0 || failedIn(baseOf(sc)) > 0:
			verdict = "INVALID"
		case got >= sc.target:
			verdict = "PASS"
		}

		fmt.Fprintf(w, "target %s/%s >= %.2f: %.2f  %-4s  %s\n", sc.id, baseOf(sc).id, sc.target, got, verdict, sc.name)
	}
	if len(invalid) > 0 {
		return fmt.Errorf("requests failed in %s: the ratios are not valid", strings.Join(invalid, ", "))
	}
	return nil
}

// printDuplicates runs the duplicates experiment and prints its outcome.
func printDuplicates(ctx context.Context, w io.Writer, hc *http.Client, baseURL string, pool *pgxpool.Pool, runID string, o options) error {
	targets := []*dupTarget{
		{name: "naive", paths: []string{pathNaive}, prefix: runID + "-dupnaive-", answers: map[string]int{}},
		{name: "idem, one instance", paths: []string{pathIdem}, prefix: runID + "-dupidem-", answers: map[string]int{}},
		{name: "idem, two instances (alternating)", paths: []string{pathIdem, pathIdem2}, prefix: runID + "-dupidem2-", answers: map[string]int{}},
		{name: "idem, generic path (before)", paths: []string{pathGeneric}, prefix: runID + "-dupgeneric-", answers: map[string]int{}},
	}
	if o.pgbouncer {
		targets = append(targets,
			&dupTarget{name: "PgBouncer: idem, one instance", paths: []string{pathPgbIdem}, prefix: runID + "-duppgb1-", answers: map[string]int{}},
			&dupTarget{name: "PgBouncer: idem, two instances", paths: []string{pathPgbIdem, pathPgbIdem2}, prefix: runID + "-duppgb2-", answers: map[string]int{}},
		)
	}
	res, err := duplicates(ctx, hc, baseURL, pool, targets, o.dup, o.dupK)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "duplicates experiment: %d distinct keys, %d identical requests sent at once per key\n", o.dup, o.dupK)
	for i, t := range targets {
		r := res[i]
		fmt.Fprintf(w, "  %-36s payments written %4d for %d keys (%d extra); keys executed more than once %d, never %d; answers: %s\n",
			t.name, r.executed, r.keys, max(r.executed-(r.keys-r.unexecuted), 0), r.dupKeys, r.unexecuted, answerSummary(t.answers))
	}
	fmt.Fprintf(w, "duplicate executions: naive %d of %d keys; idem one instance %d, two instances %d, generic path %d\n",
		res[0].dupKeys, o.dup, res[1].dupKeys, res[2].dupKeys, res[3].dupKeys)
	idemDups := res[1].dupKeys + res[2].dupKeys + res[3].dupKeys
	if o.pgbouncer {
		fmt.Fprintf(w, "duplicate executions through PgBouncer (transaction mode): idem one instance %d, two instances %d\n",
			res[4].dupKeys, res[5].dupKeys)
		idemDups += res[4].dupKeys + res[5].dupKeys
	}
	if idemDups > 0 {
		return errors.New("idem executed a key more than once")
	}
	return nil
}

// loadAvg returns the 1, 5 and 15 minute load averages, or "n/a".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "n/a"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "n/a"
	}
	return strings.Join(f[:3], " ")
}
