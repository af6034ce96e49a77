package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/idemhttp"
)

// options are the command-line flags.
type options struct {
	dsn        string
	clients    int
	conns      int
	duration   time.Duration
	warmup     time.Duration
	slice      time.Duration
	rounds     int
	dup        int
	dupK       int
	proto      string
	only       string
	syncCommit string
	cpuProfile string
}

func main() {
	var o options
	flag.StringVar(&o.dsn, "dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL URL; a private schema is created there and dropped at exit")
	flag.IntVar(&o.clients, "clients", 8, "concurrent HTTP clients (closed loop)")
	flag.IntVar(&o.conns, "conns", 0, "PostgreSQL pool size (0: max(clients, dupk))")
	flag.DurationVar(&o.duration, "duration", 5*time.Second, "time each scenario is driven per round")
	flag.DurationVar(&o.slice, "slice", 500*time.Millisecond, "within a round, scenarios take turns in slices this long")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "untimed run of every scenario before the first round")
	flag.IntVar(&o.rounds, "rounds", 3, "rounds; the table reports medians over rounds")
	flag.IntVar(&o.dup, "dup", 100, "duplicates experiment: distinct keys per route (0 skips it)")
	flag.IntVar(&o.dupK, "dupk", 8, "duplicates experiment: identical requests sent at once per key")
	flag.StringVar(&o.proto, "proto", "all", `pgdriver prototypes (proto.go), each measured as two more scenarios: variants separated by ";", each a comma list of begin,read,commit,peek,single; "all" is the first four; "none" for no prototype`)
	flag.StringVar(&o.only, "scenarios", "", "run only these scenario ids, comma-separated (a always runs: it is the baseline)")
	flag.StringVar(&o.syncCommit, "synchronous-commit", "", "synchronous_commit for the pool's sessions (default: the server's)")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the timed rounds to this file")
	flag.Parse()
	if o.clients < 1 || o.rounds < 1 || o.duration <= 0 || o.slice <= 0 || o.warmup <= 0 || o.dupK < 1 || o.dup < 0 {
		fmt.Fprintln(os.Stderr, "httpbench: -clients, -rounds, -duration, -slice, -warmup (replays need executed keys) and -dupk must be positive, -dup not negative")
		os.Exit(2)
	}
	if o.conns == 0 {
		o.conns = max(o.clients, o.dupK)
	}
	var fss []map[string]bool
	for v := range strings.SplitSeq(o.proto, ";") {
		fs, err := parseProto(v)
		if err != nil {
			fmt.Fprintln(os.Stderr, "httpbench:", err)
			os.Exit(2)
		}
		if len(fs) > 0 {
			fss = append(fss, fs)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, o, newVariants(fss)); err != nil {
		fmt.Fprintln(os.Stderr, "httpbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options, vs []variant) (err error) {
	runID := randHex(4)
	schema := "httpbench_" + runID

	admin, err := pgx.Connect(ctx, o.dsn)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() { _ = admin.Close(context.Background()) }()
	if err := createSchema(ctx, admin, schema); err != nil {
		return err
	}
	defer func() {
		if derr := dropSchema(context.Background(), admin, schema); derr != nil && err == nil {
			err = fmt.Errorf("drop schema %s: %w", schema, derr)
		}
	}()

	counter := &rtCounter{}
	app := "httpbench_" + runID
	pcfg, err := pgxpool.ParseConfig(o.dsn)
	if err != nil {
		return fmt.Errorf("parse dsn: %w", err)
	}
	pcfg.MaxConns = int32(o.conns)
	pcfg.MinConns = int32(o.conns)
	pcfg.ConnConfig.RuntimeParams["search_path"] = schema
	pcfg.ConnConfig.RuntimeParams["application_name"] = app
	if o.syncCommit != "" {
		pcfg.ConnConfig.RuntimeParams["synchronous_commit"] = o.syncCommit
	}
	pcfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("pool: %w", err)
	}
	defer pool.Close()

	drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
	if err != nil {
		return err
	}
	if err := drv.Migrate(ctx); err != nil {
		return err
	}
	mw, err := idemhttp.New(drv, nil)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /bare/payments", bareHandler(pool))
	mux.Handle("POST /idem/payments", mw.Handler(idemBusinessHandler()))
	mux.Handle("POST /naive/payments", naiveMiddleware(pool, bareHandler(pool)))
	for _, v := range vs {
		// The prototypes' known deviations (see proto.go) would log
		// here; their answers are counted instead.
		pmw, err := idemhttp.New(newPipeDriver(drv, v.features), &idemhttp.Config{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return err
		}
		mux.Handle("POST "+v.path, pmw.Handler(idemBusinessHandler()))
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()
	hc := &http.Client{
		Transport: &http.Transport{
			MaxIdleConns:        4 * max(o.clients, o.dupK),
			MaxIdleConnsPerHost: 4 * max(o.clients, o.dupK),
			DisableCompression:  true,
		},
		Timeout: 30 * time.Second,
	}
	defer hc.CloseIdleConnections()

	scs, err := scenarios(runID, vs, o.only)
	if err != nil {
		return err
	}
	cond, err := conditions(ctx, pool, o)
	if err != nil {
		return err
	}
	fmt.Println("httpbench: idem's HTTP middleware vs a bare handler vs the style guide's naive interceptor")
	fmt.Println(cond)
	fmt.Println()

	for _, sc := range scs { // connections, statement caches, keys to replay
		load(ctx, hc, srv.URL, sc, o.clients, o.warmup)
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
	}
	// Every round drives each scenario for -duration, in slices of -slice
	// that take turns in a fresh random order, so that background load,
	// checkpoints and table growth fall on all scenarios alike.
	m := &meter{conn: admin, counter: counter, cpu: &cpuMeter{conn: admin, app: app}}
	order := mrand.New(mrand.NewPCG(1, 2))
	nSlices := max(int((o.duration+o.slice-1)/o.slice), 1)
	sliceLen := o.duration / time.Duration(nSlices)
	for range o.rounds {
		tallies := make([]tally, len(scs))
		for range nSlices {
			for _, i := range order.Perm(len(scs)) {
				if err := measure(ctx, hc, srv.URL, m, scs[i], o.clients, sliceLen, &tallies[i]); err != nil {
					return err
				}
			}
		}
		for i, sc := range scs {
			sc.runs = append(sc.runs, tallies[i].result())
		}
	}
	pprof.StopCPUProfile()
	printTable(os.Stdout, scs, vs)
	fmt.Printf("load average at end %s\n", loadAvg())

	if o.dup > 0 {
		fmt.Println()
		if err := printDuplicates(ctx, os.Stdout, hc, srv.URL, pool, runID, o, vs); err != nil {
			return err
		}
	}
	return nil
}

// meter reads what a slice cost besides its requests: round trips, WAL,
// CPU. Its queries use the bench's own connection, not the traced pool.
type meter struct {
	conn    *pgx.Conn
	counter *rtCounter
	cpu     *cpuMeter
}

// measure runs one slice of sc and adds it, with what it cost, to t.
func measure(ctx context.Context, hc *http.Client, baseURL string, m *meter, sc *scenario, clients int, d time.Duration, t *tally) error {
	var lsn string
	if err := m.conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		return fmt.Errorf("wal position: %w", err)
	}
	cpu0, err := m.cpu.snapshot(ctx)
	if err != nil {
		return err
	}
	c0 := m.counter.snapshot()
	s := load(ctx, hc, baseURL, sc, clients, d)
	c1 := m.counter.snapshot()
	cpu1, err := m.cpu.snapshot(ctx)
	if err != nil {
		return err
	}
	var wal float64
	if err := m.conn.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8", lsn).Scan(&wal); err != nil {
		return fmt.Errorf("wal position: %w", err)
	}
	goCPU, pgCPU := cpu1.since(cpu0)
	t.add(s, counts{c1.roundTrips - c0.roundTrips, c1.statements - c0.statements}, wal, goCPU, pgCPU)
	return ctx.Err()
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
