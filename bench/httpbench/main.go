package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"runtime/pprof"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/pgbouncer"
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
	only       string
	sqlite     bool
	syncCommit string
	cpuProfile string
	pgbouncer  bool
	keys       string
	records    int
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
	flag.StringVar(&o.only, "scenarios", "", "run only these PostgreSQL scenario ids, comma-separated (a always runs: it is the baseline)")
	flag.BoolVar(&o.sqlite, "sqlite", true, "also measure the SQLite driver (its own table, its own bare baseline)")
	flag.StringVar(&o.syncCommit, "synchronous-commit", "", "synchronous_commit for the pool's sessions (default: the server's)")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the timed rounds to this file")
	flag.BoolVar(&o.pgbouncer, "pgbouncer", false, "also run a, b and e through a PgBouncer (pool_mode=transaction) that httpbench starts in front of -dsn's server (pa, pb, pe), and the duplicates through it")
	flag.StringVar(&o.keys, "keys", "seq", "Idempotency-Key shape: seq (run-route-n: every new key lands in the same few index pages), uuid (random UUIDv4 strings, as most clients send them) or uuid7 (UUIDv7 strings, time-ordered, as idemclient sends them)")
	flag.IntVar(&o.records, "records", 0, "completed records (keys of -keys' shape, uuid for seq; created over the last 24 h) written into idem's record table before the run, as a service holding a day or two of keys has it")
	flag.Parse()
	if o.keys != "seq" && o.keys != "uuid" && o.keys != "uuid7" {
		fmt.Fprintln(os.Stderr, "httpbench: -keys must be seq, uuid or uuid7")
		os.Exit(2)
	}
	if o.clients < 1 || o.rounds < 1 || o.duration <= 0 || o.slice <= 0 || o.warmup <= 0 || o.dupK < 1 || o.dup < 0 || o.records < 0 {
		fmt.Fprintln(os.Stderr, "httpbench: -clients, -rounds, -duration, -slice, -warmup (replays need executed keys) and -dupk must be positive, -dup and -records not negative")
		os.Exit(2)
	}
	if o.conns == 0 {
		o.conns = max(o.clients, o.dupK)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "httpbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) (err error) {
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
	if err := createFloorTable(ctx, admin, schema); err != nil {
		return err
	}
	// A second instance on the same schema (its own pool, driver and
	// middleware), as a second replica would be, for the duplicates.
	pool2, err := pgxpool.NewWithConfig(ctx, pcfg.Copy())
	if err != nil {
		return fmt.Errorf("pool: %w", err)
	}
	defer pool2.Close()
	drv2, err := pgdriver.New(pool2, &pgdriver.Config{Schema: schema})
	if err != nil {
		return err
	}
	// /idem and /idemnc share a scope: the cache-off middleware replays the
	// keys the cached one executed, from the database.
	shared := func(*http.Request) string { return "/payments" }
	mux := http.NewServeMux()
	mux.Handle("POST "+pathBare, bareHandler(pool))
	for _, r := range []struct {
		path, as string
		drv      driver.Driver[pgx.Tx]
		cfg      idemhttp.Config
	}{
		{pathIdem, pathIdem, drv, idemhttp.Config{Route: shared, Scope: principal}},
		{pathNoCache, pathIdem, drv, idemhttp.Config{Route: shared, Scope: principal, ReplayCacheBytes: idemhttp.NoReplayCache}},
		{pathIdem2, pathIdem, drv2, idemhttp.Config{Route: shared, Scope: principal}},
		// The ModeTx path of a driver without driver.TxClaimer (what
		// pgdriver did before it had one), without the cache.
		{pathGeneric, pathGeneric, generic{drv}, idemhttp.Config{Scope: principal, ReplayCacheBytes: idemhttp.NoReplayCache}},
	} {
		mw, err := idemhttp.New(r.drv, &r.cfg)
		if err != nil {
			return err
		}
		mux.Handle("POST "+r.path, as(r.as, mw.Handler(idemBusinessHandler())))
	}
	mux.Handle("POST "+pathNaive, naiveMiddleware(pool, bareHandler(pool)))
	mux.Handle("POST "+pathFloor, floorHandler(pool, true))
	mux.Handle("POST "+pathFloorNoRead, floorHandler(pool, false))
	apps := []string{app}
	var bnc *pgbouncer.Process
	if o.pgbouncer {
		bnc, err = startPgBouncer(ctx, o.dsn, schema, o.syncCommit, o.conns)
		if err != nil {
			return err
		}
		defer bnc.Stop()
		apps = append(apps, app+"_pgbouncer")
		closePools, err := routeThroughPgBouncer(ctx, mux, bnc, apps[1], schema, counter, o)
		defer closePools()
		if err != nil {
			return err
		}
	}
	srv := httptest.NewServer(labelled(mux))
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

	scs, err := scenarios(runID, o.only, o.pgbouncer, o.keys)
	if err != nil {
		return err
	}
	cond, err := conditions(ctx, pool, o, bnc)
	if err != nil {
		return err
	}
	fmt.Println("httpbench: idem's HTTP middleware vs a bare handler vs a naive check-then-execute interceptor")
	fmt.Println(cond)
	fmt.Println()
	if o.records > 0 {
		if err := prefill(ctx, hc, srv.URL, admin, schema, o.records, o.keys == "uuid7"); err != nil {
			return err
		}
	}

	m := &meter{conn: admin, counter: counter, cpu: &cpuMeter{conn: admin, apps: apps}}
	if bnc != nil {
		m.cpu.pids = []int{bnc.Pid()}
	}
	if err := drive(ctx, hc, srv.URL, m, scs, o); err != nil {
		return err
	}
	tableErr := printTable(os.Stdout, scs)
	fmt.Printf("load average at end %s\n", loadAvg())
	defer func() {
		if err == nil {
			err = tableErr
		}
	}()

	if o.dup > 0 {
		fmt.Println()
		if err := printDuplicates(ctx, os.Stdout, hc, srv.URL, pool, runID, o); err != nil {
			return err
		}
	}
	if o.sqlite {
		fmt.Println()
		return runSQLite(ctx, o, runID, hc)
	}
	return nil
}

// routeThroughPgBouncer serves pa, pb and pe's routes (and the second
// instance's, for the duplicates) on mux, through bnc: two pools (two
// instances) with the application_name app, their drivers on schema and
// their middlewares, as on a direct connection. pgdriver notices the pooler
// at its first claim. It returns a function that closes the pools.
func routeThroughPgBouncer(ctx context.Context, mux *http.ServeMux, bnc *pgbouncer.Process, app, schema string, counter *rtCounter, o options) (closePools func(), err error) {
	var pools []*pgxpool.Pool
	closePools = func() {
		for _, p := range pools {
			p.Close()
		}
	}
	cfg, err := pgxpool.ParseConfig(bnc.URL)
	if err != nil {
		return closePools, fmt.Errorf("parse pgbouncer url: %w", err)
	}
	cfg.MaxConns = int32(o.conns)
	cfg.MinConns = int32(o.conns)
	// PgBouncer passes application_name on (not search_path: its
	// connect_query sets it), and before 1.21 keeps no prepared statement
	// from one transaction to the next.
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	cfg.ConnConfig.Tracer = counter
	drvs := make([]*pgdriver.Driver, 2)
	for i := range drvs {
		p, err := pgxpool.NewWithConfig(ctx, cfg.Copy())
		if err != nil {
			return closePools, fmt.Errorf("pool through pgbouncer: %w", err)
		}
		pools = append(pools, p)
		if drvs[i], err = pgdriver.New(p, &pgdriver.Config{Schema: schema}); err != nil {
			return closePools, err
		}
	}
	shared := func(*http.Request) string { return "/payments" }
	mux.Handle("POST "+pathPgbBare, bareHandler(pools[0]))
	for _, r := range []struct {
		path string
		drv  *pgdriver.Driver
		cfg  idemhttp.Config
	}{
		{pathPgbIdem, drvs[0], idemhttp.Config{Route: shared, Scope: principal}},
		{pathPgbNoCache, drvs[0], idemhttp.Config{Route: shared, Scope: principal, ReplayCacheBytes: idemhttp.NoReplayCache}},
		{pathPgbIdem2, drvs[1], idemhttp.Config{Route: shared, Scope: principal}},
	} {
		mw, err := idemhttp.New(r.drv, &r.cfg)
		if err != nil {
			return closePools, err
		}
		mux.Handle("POST "+r.path, as(pathPgbIdem, mw.Handler(idemBusinessHandler())))
	}
	return closePools, nil
}

// as serves h as if the request had been sent to path: the fingerprint
// covers the request's target, so the routes that stand for the same
// endpoint (another instance, the cache off) must present the same one.
func as(path string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.URL.Path, r.URL.RawPath = path, ""
		h.ServeHTTP(w, r)
	})
}

// generic hides pgdriver's driver.TxClaimer: idemhttp then takes its generic
// ModeTx path (Begin, RecordClaim, RecordComplete, Commit).
type generic struct{ driver.Driver[pgx.Tx] }

// drive warms every scenario up, then runs the timed rounds: every round
// drives each scenario for -duration, in slices of -slice that take turns in
// a fresh random order, so that background load, checkpoints and table
// growth fall on all scenarios alike.
func drive(ctx context.Context, hc *http.Client, baseURL string, m *meter, scs []*scenario, o options) error {
	for _, sc := range scs { // connections, statement caches, keys to replay
		load(ctx, hc, baseURL, sc, o.clients, o.warmup)
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
		defer pprof.StopCPUProfile()
	}
	order := mrand.New(mrand.NewPCG(1, 2))
	nSlices := max(int((o.duration+o.slice-1)/o.slice), 1)
	sliceLen := o.duration / time.Duration(nSlices)
	for range o.rounds {
		tallies := make([]tally, len(scs))
		for range nSlices {
			for _, i := range order.Perm(len(scs)) {
				if err := measure(ctx, hc, baseURL, m, scs[i], o.clients, sliceLen, &tallies[i]); err != nil {
					return err
				}
			}
		}
		for i, sc := range scs {
			sc.runs = append(sc.runs, tallies[i].result())
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

// measure runs one slice of sc and adds it, with what it cost, to t. A
// meter without a connection (SQLite) measures this process only.
func measure(ctx context.Context, hc *http.Client, baseURL string, m *meter, sc *scenario, clients int, d time.Duration, t *tally) error {
	if m.conn == nil {
		cpu0 := selfCPU()
		s := load(ctx, hc, baseURL, sc, clients, d)
		t.add(s, counts{}, 0, selfCPU()-cpu0, 0)
		return ctx.Err()
	}
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
