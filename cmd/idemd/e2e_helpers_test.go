package main_test

// Helpers of the end-to-end tests (e2e_test.go): the idemd binary (built
// once, without -race), idemd processes, fresh PostgreSQL databases, a TCP
// proxy that can cut PostgreSQL off, the order load, and the invariants.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/internal/freeport"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
)

// Knobs of the end-to-end tests. IDEM_E2E_SOAK=1 turns on a longer soak
// (ten times the orders: e2eSoakOrders on PostgreSQL, half on SQLite; and
// e2eSoakKills kills, restarts or outages per scenario); -e2e.orders and
// -e2e.kills override both:
//
//	IDEM_E2E_SOAK=1 go test -race -run TestE2E -timeout 20m ./cmd/idemd
//	go test -run 'TestE2E/postgres/SIGKILL' -e2e.orders 1000 -e2e.kills 3 ./cmd/idemd
var (
	e2eOrdersFlag     = flag.Int("e2e.orders", 0, "orders per idemd end-to-end scenario (0: the scenario's default, 300 or 150 with SQLite; ten times more with IDEM_E2E_SOAK=1)")
	e2eKillsFlag      = flag.Int("e2e.kills", 0, "kills (restarts, outages) per idemd end-to-end scenario (0: 1, or 5 with IDEM_E2E_SOAK=1)")
	e2eLongOutageFlag = flag.Duration("e2e.long-outage", 0, "length of the first Kafka outage of postgres/kafka-unreachable (0: 10 s like the others, or with IDEM_E2E_SOAK=1 the relay's hold timeout + 10 s, 60 s)")
)

// relayPublishTimeout is the publish timeout of idemd's relay: outbox's
// default RelayConfig.PublishTimeout (idemd sets none). relayHoldTimeout
// is how long its claim transactions may stay idle (PublishTimeout + 20 s,
// idle_in_transaction_session_timeout): kgo's idempotent producer keeps
// waiting past PublishTimeout for records in flight at the cut (outcome
// unknown), so a relay stuck so gives its events up only when PostgreSQL
// ends its session at the hold timeout; other rounds publish them again.
const (
	relayPublishTimeout = 30 * time.Second
	relayHoldTimeout    = relayPublishTimeout + 20*time.Second
)

const (
	e2eSoakEnv    = "IDEM_E2E_SOAK"
	e2eSoakOrders = 3000
	e2eSoakKills  = 5
)

func e2eSoak() bool { return os.Getenv(e2eSoakEnv) == "1" }

// e2eOrders is the number of orders of a scenario whose default is def.
func e2eOrders(def int) int {
	switch {
	case *e2eOrdersFlag > 0:
		return *e2eOrdersFlag
	case e2eSoak():
		return max(def, e2eSoakOrders*def/300)
	}
	return def
}

// e2eKills is the number of kills (or outages) of a scenario.
func e2eKills() int {
	switch {
	case *e2eKillsFlag > 0:
		return *e2eKillsFlag
	case e2eSoak():
		return e2eSoakKills
	}
	return 1
}

// e2eLongOutage is the length of the first Kafka outage of
// postgres/kafka-unreachable, 0 when it is as long as the others (outage):
// in the soak, longer than the relay's publish and hold timeouts, so that
// the publishes in flight at the cut are given up (their claims ended by
// PostgreSQL) and their events published again.
func e2eLongOutage() time.Duration {
	switch {
	case *e2eLongOutageFlag > 0:
		return *e2eLongOutageFlag
	case e2eSoak():
		return relayHoldTimeout + 10*time.Second
	}
	return 0
}

// ---------------------------------------------------------------------------
// The binary

var (
	buildOnce sync.Once
	buildDir  string
	buildBin  string
	buildErr  error
	helpOut   string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// idemdBinary builds idemd once per test binary (without -race, whatever
// the tests run with) and returns its path.
func idemdBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			buildErr = fmt.Errorf("go tool not found: %w", err)
			return
		}
		if buildDir, err = os.MkdirTemp("", "idemd-test-"); err != nil {
			buildErr = err
			return
		}
		bin := filepath.Join(buildDir, "idemd")
		if out, err := exec.Command(goBin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %w\n%s", err, out)
			return
		}
		out, _ := exec.Command(bin, "-h").CombinedOutput()
		buildBin, helpOut = bin, string(out)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildBin
}

// hasFlag reports whether idemd -h lists -name.
func hasFlag(t testing.TB, name string) bool {
	idemdBinary(t)
	return strings.Contains(helpOut, "  -"+name+" ")
}

// ---------------------------------------------------------------------------
// idemd processes

// proc is one idemd process.
type proc struct {
	name   string
	args   []string
	base   string // http://127.0.0.1:PORT
	cmd    *exec.Cmd
	stderr *testlog.Buffer
	done   chan struct{} // closed when it exited
	err    error         // its exit, once done is closed
	// stopping is set before the test signals it: an exit without it is
	// unexpected.
	stopping atomic.Bool
	started  time.Time
}

var listenLineRe = regexp.MustCompile(`^idemd listening on (http://\S+) `)

// consumerLogRe matches the text log lines of a consumer's start and of
// its first assignment.
var consumerLogRe = regexp.MustCompile(`(?m)^time=(\S+) level=INFO msg="idemkafka: (consumer started|partitions assigned)" group=(\S+)`)

// rejoinDelay reads a process's text log: the longest time, over its
// consumer groups, from a consumer's start to its first assignment. ok is
// false when a group that started has no assignment.
func rejoinDelay(log string) (d time.Duration, ok bool) {
	started := map[string]time.Time{}
	assigned := map[string]time.Time{}
	for _, m := range consumerLogRe.FindAllStringSubmatch(log, -1) {
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			continue
		}
		into := started
		if m[2] == "partitions assigned" {
			into = assigned
		}
		if _, seen := into[m[3]]; !seen {
			into[m[3]] = at
		}
	}
	for group, s := range started {
		a, seen := assigned[group]
		if !seen {
			return 0, false
		}
		d = max(d, a.Sub(s))
	}
	return d, len(started) > 0
}

// awaitRejoin is rejoinDelay on p's log once it shows an assignment for
// each consumer that started, or when within passed.
func awaitRejoin(p *proc, within time.Duration) (time.Duration, bool) {
	deadline := time.Now().Add(within)
	for {
		d, ok := rejoinDelay(p.stderr.String())
		if ok || time.Now().After(deadline) {
			return d, ok
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// assignedAfter reads a process's text log: the longest time, over its
// consumer groups that were assigned partitions at or after since, from
// since to the first such assignment. ok is false when none was.
func assignedAfter(log string, since time.Time) (d time.Duration, ok bool) {
	seen := map[string]bool{}
	for _, m := range consumerLogRe.FindAllStringSubmatch(log, -1) {
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil || at.Before(since) || m[2] != "partitions assigned" || seen[m[3]] {
			continue
		}
		seen[m[3]] = true
		d, ok = max(d, at.Sub(since)), true
	}
	return d, ok
}

// relayLogRe matches the text log lines of the relay's warnings and errors.
var relayLogRe = regexp.MustCompile(`(?m)^time=(\S+) level=(WARN|ERROR) msg="(outbox: [^"]*)"(?:.* err="((?:[^"\\]|\\.)*)")?`)

// relayLog summarises the relay's warnings and errors logged by procs
// since since: each distinct level, message and error with its count.
func relayLog(procs []*proc, since time.Time) string {
	counts := map[string]int{}
	var order []string
	for _, p := range procs {
		for _, m := range relayLogRe.FindAllStringSubmatch(p.stderr.String(), -1) {
			if at, err := time.Parse(time.RFC3339Nano, m[1]); err != nil || at.Before(since) {
				continue
			}
			k := m[2] + " " + m[3]
			if m[4] != "" {
				k += ": " + clip(m[4], 200)
			}
			if counts[k] == 0 {
				order = append(order, k)
			}
			counts[k]++
		}
	}
	if len(order) == 0 {
		return "none"
	}
	var b strings.Builder
	for i, k := range order {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%dx %s", counts[k], k)
	}
	return b.String()
}

// cluster tracks the idemd processes of one scenario: it dumps their stderr
// on failure and kills those still running when the test ends.
type cluster struct {
	t *testing.T
	// dir is the processes' working directory: a default relative path
	// (./idemd.db, ./idemd.kafka) lands there, not in the repository.
	dir string
	// ownGroups starts each process in a process group of its own, for
	// the scenarios that stop one (SIGSTOP): in the test's group, a
	// stopped idemd is sent SIGHUP by the kernel when that group is
	// orphaned (go test run in the background, a CI runner) and one of
	// its processes exits.
	ownGroups bool
	mu        sync.Mutex
	procs     []*proc
	n         map[string]int
	// spare holds the connection slots (testdb.ReserveConns) of the
	// processes on PostgreSQL that exited, each a release of
	// idemdPGConns slots: a restart takes one instead of waiting for
	// slots the machine's other tests took meanwhile. A CI run's replica
	// restarted at once after a SIGKILL waited 20 s for them, which its
	// failover counted. They are given back when the test ends.
	spare  []func()
	closed bool // the test ended: keep gives slots back at once
}

func newCluster(t *testing.T) *cluster {
	c := &cluster{t: t, dir: t.TempDir(), n: map[string]int{}}
	t.Cleanup(func() {
		c.mu.Lock()
		procs := slices.Clone(c.procs)
		c.mu.Unlock()
		for _, p := range procs {
			p.stopping.Store(true)
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		c.mu.Lock()
		spare := c.spare
		c.spare, c.closed = nil, true
		c.mu.Unlock()
		for _, release := range spare {
			release()
		}
		if t.Failed() {
			for _, p := range procs {
				t.Logf("---- %s (%s), %s; stderr tail:\n%s", p.name, strings.Join(p.args, " "), p.exitString(), tail(p.stderr.String()))
			}
		}
	})
	return c
}

// idemdPGConns is the most PostgreSQL connections one idemd replica of
// these tests opens (its pool and its LISTEN session; TestE2EScale counts
// 5-6 each).
const idemdPGConns = 6

// usesPostgres reports whether idemd's args name a PostgreSQL database.
func usesPostgres(args []string) bool {
	for i, a := range args {
		if (a == "-db" && i+1 < len(args) && strings.HasPrefix(args[i+1], "postgres")) ||
			strings.HasPrefix(a, "-db=postgres") {
			return true
		}
	}
	return false
}

// start runs idemd with args and waits for its listen line. It does not
// fail the test, so that any goroutine may call it.
func (c *cluster) start(name string, args ...string) (*proc, error) {
	bin := idemdBinary(c.t)
	c.mu.Lock()
	c.n[name]++
	p := &proc{
		name:   fmt.Sprintf("%s#%d", name, c.n[name]),
		args:   args,
		cmd:    exec.Command(bin, args...),
		stderr: &testlog.Buffer{},
		done:   make(chan struct{}),
	}
	c.mu.Unlock()
	// Its PostgreSQL connections count against the tests' slots, which
	// the other test processes of the machine share: without them, a
	// few replicas and another package's tests ran the server out of
	// connections ("too many clients already").
	unreserve := func() {}
	if usesPostgres(args) {
		release, err := c.reserve()
		if err != nil {
			return nil, fmt.Errorf("start %s: %w", p.name, err)
		}
		unreserve = func() { c.keep(release) }
	}
	p.cmd.Dir = c.dir
	p.cmd.Stderr = p.stderr
	if c.ownGroups {
		// Killed with the test all the same (not only by the
		// cleanup): an interrupt no longer reaches its group.
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		unreserve()
		return nil, err
	}
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		unreserve()
		return nil, fmt.Errorf("start %s: %w", p.name, err)
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- strings.TrimSuffix(line, "\n")
		_, _ = io.Copy(io.Discard, stdout)
		p.err = p.cmd.Wait()
		unreserve()
		close(p.done)
	}()
	select {
	case line := <-lines:
		m := listenLineRe.FindStringSubmatch(line)
		if m == nil {
			p.stopping.Store(true)   // reported here
			_ = p.cmd.Process.Kill() // a no-op on an exited one: its status stays
			<-p.done
			return nil, fmt.Errorf("%s: first line %q, not the listen line (%s); stderr:\n%s", p.name, line, p.exitString(), tail(p.stderr.String()))
		}
		p.base = m[1]
	case <-time.After(60 * time.Second):
		return nil, fmt.Errorf("%s: no listen line within 60s; stderr:\n%s", p.name, tail(p.stderr.String()))
	}
	return p, nil
}

// reserve takes idemdPGConns connection slots for a process on
// PostgreSQL: those of one that exited if the cluster keeps any, else new
// ones.
func (c *cluster) reserve() (release func(), err error) {
	c.mu.Lock()
	if n := len(c.spare); n > 0 {
		release = c.spare[n-1]
		c.spare = c.spare[:n-1]
	}
	c.mu.Unlock()
	if release != nil {
		return release, nil
	}
	return testdb.ReserveConns(context.Background(), idemdPGConns)
}

// reserveAhead takes the connection slots of k more processes on
// PostgreSQL now, for starts the test makes later under load: a scenario
// that measures how soon a new replica takes work must not count the
// wait for slots the machine's other tests hold (a CI run's scale-out
// waited 25 s for them).
func (c *cluster) reserveAhead(k int) error {
	for range k {
		release, err := testdb.ReserveConns(context.Background(), idemdPGConns)
		if err != nil {
			return err
		}
		c.keep(release)
	}
	return nil
}

// keep takes back the slots of a process that exited (or did not start)
// for the cluster's next start.
func (c *cluster) keep(release func()) {
	c.mu.Lock()
	closed := c.closed
	if !closed {
		c.spare = append(c.spare, release)
	}
	c.mu.Unlock()
	if closed {
		release()
	}
}

// unexpectedExits lists the processes that exited without being asked to.
func (c *cluster) unexpectedExits() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, p := range c.procs {
		select {
		case <-p.done:
			if !p.stopping.Load() {
				out = append(out, fmt.Sprintf("%s exited by itself: %s", p.name, p.exitString()))
			}
		default:
		}
	}
	return out
}

func (p *proc) exitString() string {
	select {
	case <-p.done:
		if p.err == nil {
			return "exit status 0"
		}
		return p.err.Error()
	default:
		return "running"
	}
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// stop sends sig and waits up to wait for the exit; it kills the process
// and reports an error if it is still running then. For SIGTERM it also
// reports an exit code other than 0.
func (p *proc) stop(sig syscall.Signal, wait time.Duration) error {
	p.stopping.Store(true)
	if err := p.cmd.Process.Signal(sig); err != nil && p.running() {
		return fmt.Errorf("%s: signal %v: %w", p.name, sig, err)
	}
	select {
	case <-p.done:
	case <-time.After(wait):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s still running %s after %v (killed)", p.name, wait, sig)
	}
	if sig != syscall.SIGKILL && p.err != nil {
		return fmt.Errorf("%s after %v: %w, want exit status 0", p.name, sig, p.err)
	}
	return nil
}

// tail is the end of an idemd's stderr: its last warnings and errors, its
// last lines other than the access log, and its very last lines.
func tail(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	var warn, other []string
	for _, l := range lines {
		switch {
		case strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") || strings.HasPrefix(l, "idemd:") || strings.HasPrefix(l, "panic"):
			warn = append(warn, l)
		case !strings.Contains(l, "msg=request "):
			other = append(other, l)
		}
	}
	last := func(ls []string, n int) []string { return ls[max(0, len(ls)-n):] }
	var b strings.Builder
	fmt.Fprintf(&b, "  (%d lines, %d warnings/errors; the last ones:)\n", len(lines), len(warn))
	for _, l := range last(warn, 15) {
		b.WriteString("  ! " + clip(l, 400) + "\n")
	}
	b.WriteString("  (the last lines besides warnings and the access log:)\n")
	for _, l := range last(other, 20) {
		b.WriteString("  . " + clip(l, 400) + "\n")
	}
	b.WriteString("  (the last lines:)\n")
	for _, l := range last(lines, 8) {
		b.WriteString("  | " + clip(l, 400) + "\n")
	}
	return b.String()
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// freeAddr returns a 127.0.0.1 address with a port free right now, so that
// a restarted idemd listens where the clients keep retrying. The port is
// outside the ephemeral range: a client connection of another test cannot
// take it between a kill and the restart.
func freeAddr(t testing.TB) string {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// commonArgs are the flags of every idemd of the scenarios.
func commonArgs(addr, db string) []string {
	return []string{"-addr", addr, "-db", db, "-cleanup", "off", "-log-format", "text", "-shutdown-timeout", "10s"}
}

// ---------------------------------------------------------------------------
// Databases

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// pgDatabase is a fresh PostgreSQL database on the server of
// IDEM_TEST_DATABASE_URL, dropped when the test ends.
type pgDatabase struct {
	name string
	url  *url.URL // of the database
	pool *pgxpool.Pool
}

func newPGDatabase(t *testing.T) *pgDatabase {
	t.Helper()
	testdb.RequirePostgres(t)
	u, err := url.Parse(testdb.DSN())
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		t.Fatalf("IDEM_TEST_DATABASE_URL %q: the end-to-end tests need a postgres:// URL", testdb.DSN())
	}
	admin := *u
	admin.Path = "/postgres"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin.String())
	if err != nil {
		t.Fatalf("connect to the postgres database: %v", err)
	}
	defer conn.Close(ctx)
	name := "e2e_" + randHex(6)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, admin.String())
		if err != nil {
			t.Logf("drop database %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Logf("drop database %s: %v", name, err)
		}
	})
	db := *u
	db.Path = "/" + name
	d := &pgDatabase{name: name, url: &db}
	cfg, err := pgxpool.ParseConfig(db.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	if d.pool, err = pgxpool.NewWithConfig(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.pool.Close) // before the drop
	return d
}

// via returns the database's URL through another host:port (a proxy).
func (d *pgDatabase) via(hostport string) string {
	u := *d.url
	u.Host = hostport
	return u.String()
}

// dbOrder is a row of customer_order, dbPayment one of payment.
type dbOrder struct {
	id, customer int64
	amount       decimal.Decimal
	status       string
	paymentID    *int64
}

type dbPayment struct {
	id                 int64
	provider, external string
	amount             decimal.Decimal
	status             string
	customer           int64
}

// dbState is what the database holds.
type dbState struct {
	orders   []dbOrder
	payments []dbPayment
}

// stateReader reads the database of a scenario.
type stateReader func(ctx context.Context) (dbState, error)

const (
	ordersQuery   = `SELECT id, customer_id, CAST(amount AS text), status, payment_id FROM customer_order ORDER BY id`
	paymentsQuery = `SELECT id, payment_provider, external_payment_id, CAST(amount AS text), status, customer_id FROM payment ORDER BY id`
)

type rowScanner interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

func scanOrders(rs rowScanner) ([]dbOrder, error) {
	var out []dbOrder
	for rs.Next() {
		var (
			o   dbOrder
			amt string
		)
		if err := rs.Scan(&o.id, &o.customer, &amt, &o.status, &o.paymentID); err != nil {
			return nil, err
		}
		var err error
		if o.amount, err = decimal.NewFromString(amt); err != nil {
			return nil, fmt.Errorf("order %d: amount %q: %w", o.id, amt, err)
		}
		out = append(out, o)
	}
	return out, rs.Err()
}

func scanPayments(rs rowScanner) ([]dbPayment, error) {
	var out []dbPayment
	for rs.Next() {
		var (
			p   dbPayment
			amt string
		)
		if err := rs.Scan(&p.id, &p.provider, &p.external, &amt, &p.status, &p.customer); err != nil {
			return nil, err
		}
		var err error
		if p.amount, err = decimal.NewFromString(amt); err != nil {
			return nil, fmt.Errorf("payment %d: amount %q: %w", p.id, amt, err)
		}
		out = append(out, p)
	}
	return out, rs.Err()
}

// state reads the PostgreSQL database directly (never through a proxy).
func (d *pgDatabase) state(ctx context.Context) (dbState, error) {
	var s dbState
	rows, err := d.pool.Query(ctx, ordersQuery)
	if err != nil {
		return s, err
	}
	s.orders, err = scanOrders(rows)
	rows.Close()
	if err != nil {
		return s, err
	}
	rows, err = d.pool.Query(ctx, paymentsQuery)
	if err != nil {
		return s, err
	}
	s.payments, err = scanPayments(rows)
	rows.Close()
	return s, err
}

// created counts the orders of ids still CREATED.
func (d *pgDatabase) created(ctx context.Context, ids []int64) (int, error) {
	var n int
	err := d.pool.QueryRow(ctx, `SELECT count(*) FROM customer_order WHERE id = ANY($1) AND status = 'CREATED'`, ids).Scan(&n)
	return n, err
}

// outboxBacklog counts the outbox events not yet published, and those of
// them parked as poison.
func (d *pgDatabase) outboxBacklog(ctx context.Context) (pending, parked int, err error) {
	err = d.pool.QueryRow(ctx, `SELECT count(*), count(parked_at) FROM outbox_pending`).Scan(&pending, &parked)
	return pending, parked, err
}

// failedAttempts counts the outbox events not yet published that failed
// to publish at least once, with the most attempts of one and the last
// error of one of those.
func (d *pgDatabase) failedAttempts(ctx context.Context) (events, most int, lastErr string, err error) {
	err = d.pool.QueryRow(ctx, `SELECT count(*), coalesce(max(attempts), 0), coalesce(max(last_error), '')
		FROM outbox_pending WHERE attempts > 0`).Scan(&events, &most, &lastErr)
	return events, most, lastErr, err
}

// heldClaims counts the sessions of the database idle in a transaction
// (the relays' claims while they publish), with the age of the oldest
// transaction.
func (d *pgDatabase) heldClaims(ctx context.Context) (n int, oldest time.Duration, err error) {
	var secs float64
	err = d.pool.QueryRow(ctx, `SELECT count(*), coalesce(extract(epoch FROM max(now() - xact_start)), 0)::float8
		FROM pg_stat_activity WHERE datname = $1 AND state LIKE 'idle in transaction%'`, d.name).Scan(&n, &secs)
	return n, time.Duration(secs * float64(time.Second)), err
}

// processed counts the rows of the inbox (processed_event) by consumer.
func (d *pgDatabase) processed(ctx context.Context) (map[string]int, error) {
	rows, err := d.pool.Query(ctx, `SELECT consumer_name, count(*) FROM processed_event GROUP BY consumer_name`)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for rows.Next() {
		var (
			c string
			n int
		)
		if err := rows.Scan(&c, &n); err != nil {
			rows.Close()
			return nil, err
		}
		out[c] = n
	}
	return out, rows.Err()
}

// firstPublishedSince returns when the first event published at or after
// since was published (by the database's clock, on this host).
func (d *pgDatabase) firstPublishedSince(ctx context.Context, since time.Time) (time.Time, error) {
	var at *time.Time
	err := d.pool.QueryRow(ctx, `SELECT min(published_at) FROM outbox_published WHERE published_at >= $1`, since).Scan(&at)
	if err == nil && at == nil {
		err = errors.New("none")
	}
	if err != nil {
		return time.Time{}, err
	}
	return *at, nil
}

// awaitOutboxDrained waits (up to within) until the outbox has no event
// left to publish; it fails the test if one is parked, or if some are still
// pending then.
func awaitOutboxDrained(t *testing.T, d *pgDatabase, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within+10*time.Second)
	defer cancel()
	start := time.Now()
	for {
		pending, parked, err := d.outboxBacklog(ctx)
		switch {
		case err == nil && parked > 0:
			t.Errorf("outbox: %d events parked (%d pending)", parked, pending)
			return
		case err == nil && pending == 0:
			return
		case time.Since(start) > within:
			t.Errorf("outbox not drained %.0f s after the invariants held: %d events pending (err %v)", within.Seconds(), pending, err)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// sqliteState reads the SQLite file at path, while idemd runs (WAL: the
// reader does not block it) or after it stopped.
func sqliteState(path string) stateReader {
	return func(ctx context.Context) (dbState, error) {
		var s dbState
		db, err := sql.Open("sqlite", sqlitedriver.DSN(path, 10*time.Second))
		if err != nil {
			return s, err
		}
		defer db.Close()
		rows, err := db.QueryContext(ctx, ordersQuery)
		if err != nil {
			return s, err
		}
		s.orders, err = scanOrders(rows)
		_ = rows.Close()
		if err != nil {
			return s, err
		}
		rows, err = db.QueryContext(ctx, paymentsQuery)
		if err != nil {
			return s, err
		}
		s.payments, err = scanPayments(rows)
		_ = rows.Close()
		return s, err
	}
}

// ---------------------------------------------------------------------------
// A TCP proxy in front of PostgreSQL that can cut it off

type pgProxy struct {
	upstream string
	addr     string
	mu       sync.Mutex
	ln       net.Listener
	conns    map[net.Conn]struct{}
	down     bool
	closed   bool
	cuts     int // connections closed by cut
}

func newPGProxy(t testing.TB, upstream string) *pgProxy {
	t.Helper()
	ln, err := freeport.Listen() // listened on again after a cut

	if err != nil {
		t.Fatal(err)
	}
	p := &pgProxy{upstream: upstream, addr: ln.Addr().String(), ln: ln, conns: map[net.Conn]struct{}{}}
	go p.serve(ln)
	t.Cleanup(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		p.cut()
	})
	return p
}

func (p *pgProxy) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go p.pipe(c)
	}
}

func (p *pgProxy) pipe(c net.Conn) {
	u, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	if p.down || p.closed {
		p.mu.Unlock()
		_ = c.Close()
		_ = u.Close()
		return
	}
	p.conns[c], p.conns[u] = struct{}{}, struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(u, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, u); done <- struct{}{} }()
	<-done
	_ = c.Close()
	_ = u.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, u)
	p.mu.Unlock()
}

// cut closes every proxied connection and the listener (new connections
// are refused) until restore. It returns the number of connections cut.
func (p *pgProxy) cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	n := len(p.conns) / 2
	for c := range p.conns {
		_ = c.Close()
	}
	p.cuts += n
	return n
}

// restore listens again on the same address.
func (p *pgProxy) restore() error {
	var (
		ln  net.Listener
		err error
	)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if ln, err = net.Listen("tcp", p.addr); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("proxy: listen again on %s: %w", p.addr, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = ln.Close()
		return nil
	}
	p.down, p.ln = false, ln
	go p.serve(ln)
	return nil
}

// ---------------------------------------------------------------------------
// A gate inside the kfake brokers' listeners that can cut Kafka off

// kafkaGate wraps the listeners of a kfake cluster (kfake.ListenFn). cut
// closes every connection accepted so far and the listening sockets
// themselves, so that a client's requests fail and its dials are refused,
// as with brokers that are down; restore listens again on the same
// addresses. kfake's accept loops do not notice: a gated listener's Accept
// waits while it is cut. (kfake advertises its listeners' own addresses,
// so a TCP proxy in front of them, like pgProxy, would be bypassed after
// the first metadata request; the gate sits inside.)
type kafkaGate struct {
	mu      sync.Mutex
	down    bool
	lns     []*gateListener
	conns   map[*gateConn]struct{}
	changed chan struct{} // closed when down or a listener changes
}

func newKafkaGate() *kafkaGate {
	return &kafkaGate{conns: map[*gateConn]struct{}{}, changed: make(chan struct{})}
}

// listen is the kfake.ListenFn.
func (g *kafkaGate) listen(network, address string) (net.Listener, error) {
	var ln net.Listener
	var err error
	if network == "tcp" && (address == "127.0.0.1:0" || address == ":0") {
		ln, err = freeport.Listen() // listened on again after a cut
	} else {
		ln, err = net.Listen(network, address)
	}
	if err != nil {
		return nil, err
	}
	l := &gateListener{g: g, network: network, addr: ln.Addr(), ln: ln}
	g.mu.Lock()
	g.lns = append(g.lns, l)
	g.mu.Unlock()
	return l, nil
}

// notify wakes the waiting Accepts; g.mu is held.
func (g *kafkaGate) notify() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// cut closes the listening sockets and every connection until restore; it
// returns the number of connections closed.
func (g *kafkaGate) cut() int {
	g.mu.Lock()
	g.down = true
	for _, l := range g.lns {
		if l.ln != nil {
			_ = l.ln.Close()
			l.ln = nil
		}
	}
	conns := make([]*gateConn, 0, len(g.conns))
	for c := range g.conns {
		conns = append(conns, c)
	}
	g.notify()
	g.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
	return len(conns)
}

// restore listens again on the addresses of the cut listeners.
func (g *kafkaGate) restore() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.down = false
	defer g.notify()
	for _, l := range g.lns {
		if l.closed || l.ln != nil {
			continue
		}
		var err error
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if l.ln, err = net.Listen(l.network, l.addr.String()); err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("kafka gate: listen again on %s: %w", l.addr, err)
		}
	}
	return nil
}

type gateListener struct {
	g       *kafkaGate
	network string
	addr    net.Addr
	ln      net.Listener // nil while cut; guarded by g.mu
	closed  bool         // by kfake; guarded by g.mu
}

func (l *gateListener) Accept() (net.Conn, error) {
	g := l.g
	for {
		g.mu.Lock()
		ln, closed, changed := l.ln, l.closed, g.changed
		g.mu.Unlock()
		if closed {
			return nil, net.ErrClosed
		}
		if ln == nil { // cut: wait for restore (or Close)
			<-changed
			continue
		}
		c, err := ln.Accept()
		g.mu.Lock()
		if err != nil {
			retry := !l.closed && l.ln != ln // cut under us
			g.mu.Unlock()
			if retry {
				continue
			}
			return nil, err
		}
		if g.down || l.closed {
			g.mu.Unlock()
			_ = c.Close()
			continue
		}
		gc := &gateConn{Conn: c, g: g}
		g.conns[gc] = struct{}{}
		g.mu.Unlock()
		return gc, nil
	}
}

func (l *gateListener) Close() error {
	g := l.g
	g.mu.Lock()
	defer g.mu.Unlock()
	l.closed = true
	g.notify()
	if l.ln != nil {
		err := l.ln.Close()
		l.ln = nil
		return err
	}
	return nil
}

func (l *gateListener) Addr() net.Addr { return l.addr }

type gateConn struct {
	net.Conn
	g *kafkaGate
}

func (c *gateConn) Close() error {
	c.g.mu.Lock()
	delete(c.g.conns, c)
	c.g.mu.Unlock()
	return c.Conn.Close()
}

// ---------------------------------------------------------------------------
// Orders and the load

// order is one business operation: one key, one body, retried until
// answered.
type order struct {
	idx      int
	key      string
	customer int64
	amount   decimal.Decimal
	body     []byte

	mu        sync.Mutex
	ids       []int64   // of every 201 answer, load and replay
	answered  time.Time // of the first 201
	status    int       // of the last answer
	lastErr   string
	notReplay bool // a replay-pass answer without Idempotent-Replayed
}

// makeOrders plans n orders of customers 1..customers; about 15% exceed
// the payment limit (10000.0000) and must be REJECTED, and the limit
// itself (CONFIRMED) and one ten-thousandth above it (REJECTED) are among
// them.
func makeOrders(n, customers int) []*order {
	run := randHex(4)
	rng := mrand.New(mrand.NewPCG(uint64(n), 7))
	out := make([]*order, n)
	for i := range out {
		var amount string
		switch {
		case i == 0:
			amount = "10000.0000"
		case i == 1:
			amount = "10000.0001"
		case i == 2:
			amount = "19.9"
		case rng.IntN(100) < 15:
			amount = decimal.New(100_000_001+rng.Int64N(500_000_000), -4).StringFixed(4)
		default:
			amount = decimal.New(10_000+rng.Int64N(99_990_000), -4).StringFixed(4)
		}
		customer := int64(1 + i%customers)
		out[i] = &order{
			idx:      i,
			key:      fmt.Sprintf("e2e-%s-%05d", run, i),
			customer: customer,
			amount:   decimal.RequireFromString(amount),
			body: fmt.Appendf(nil, `{"customer_id":%d,"amount":%q,"items":[{"sku":"SKU-%d","quantity":%d}]}`,
				customer, amount, i%7, 1+i%3),
		}
	}
	return out
}

var paymentLimit = decimal.RequireFromString("10000.0000")

// wantStatus is the final status of an order of amount a.
func wantStatus(a decimal.Decimal) string {
	if a.GreaterThan(paymentLimit) {
		return "REJECTED"
	}
	return "CONFIRMED"
}

// record notes an answer; it reports whether it is the order's first 201.
func (o *order) record(status int, body []byte) (first bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.status = status
	if status != http.StatusCreated {
		o.lastErr = fmt.Sprintf("%d %s", status, clip(strings.TrimSpace(string(body)), 200))
		return false
	}
	var v struct {
		ID string `json:"id"`
	}
	id, err := int64(0), json.Unmarshal(body, &v)
	if err == nil {
		id, err = strconv.ParseInt(v.ID, 10, 64)
	}
	if err != nil || id <= 0 {
		o.lastErr = fmt.Sprintf("201 without an order id: %s", clip(string(body), 200))
		return false
	}
	o.ids = append(o.ids, id)
	if o.answered.IsZero() {
		o.answered = time.Now()
		return true
	}
	return false
}

func (o *order) fail(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.lastErr = clip(err.Error(), 300)
}

// firstID is the id of the first 201, 0 before.
func (o *order) firstID() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.ids) == 0 {
		return 0
	}
	return o.ids[0]
}

// answeredBy returns the ids of the orders answered at or before t.
func answeredBy(orders []*order, t time.Time) []int64 {
	var ids []int64
	for _, o := range orders {
		o.mu.Lock()
		if !o.answered.IsZero() && !o.answered.After(t) {
			ids = append(ids, o.ids[0])
		}
		o.mu.Unlock()
	}
	return ids
}

// retryable says whether a status idemclient gave up on is worth another
// round (the server is restarting or its database is away).
func retryable(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return true
	}
	return status >= 500
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// newIdemClient is one client of the load: idemclient on its own
// connections (through rt, when not nil).
func newIdemClient(rt http.RoundTripper) (*idemclient.Client, *http.Transport) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 4
	if rt == nil {
		rt = tr
	}
	c, err := idemclient.New(&idemclient.Config{
		HTTPClient:  &http.Client{Transport: rt, Timeout: 15 * time.Second},
		MaxAttempts: 10,
		BaseDelay:   50 * time.Millisecond,
		MaxDelay:    time.Second,
	})
	if err != nil {
		panic(err) // a valid constant configuration
	}
	return c, tr
}

// send posts o with its key until a 201 or a final answer (or ctx ends);
// it calls answered after the first 201. It reports whether the last
// answer was a 201 marked Idempotent-Replayed.
func send(ctx context.Context, c *idemclient.Client, base string, o *order, answered func()) (replayed bool) {
	for ctx.Err() == nil {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/orders", bytes.NewReader(o.body))
		if err != nil {
			o.fail(err)
			return false
		}
		req.Header.Set("Content-Type", "application/json")
		if req, err = idemclient.WithKey(req, o.key); err != nil {
			o.fail(err)
			return false
		}
		resp, err := c.Do(req)
		if err != nil {
			o.fail(err)
			if errors.Is(err, idemclient.ErrKeyReused) {
				return false
			}
			sleepCtx(ctx, 100*time.Millisecond)
			continue
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			o.fail(err)
			continue
		}
		if o.record(resp.StatusCode, body) {
			answered()
		}
		switch {
		case resp.StatusCode == http.StatusCreated:
			return idemclient.Replayed(resp)
		case retryable(resp.StatusCode):
			sleepCtx(ctx, 100*time.Millisecond)
		default:
			return false // a final answer other than 201: reported by the invariants
		}
	}
	return false
}

// load sends the orders from clients concurrent clients. transport, if
// set, gives the RoundTripper of client i; base is the URL they post to.
type load struct {
	orders    []*order
	clients   int
	base      string
	transport func(i int) http.RoundTripper
	// onAnswer is called with the number of orders answered so far after
	// each first 201; it must not block.
	onAnswer func(n int64)
	// gate, if set, is called before handing out order i; false stops.
	gate     func(ctx context.Context, i int) bool
	answered atomic.Int64
}

func (l *load) run(ctx context.Context) {
	ch := make(chan *order)
	var wg sync.WaitGroup
	for i := range l.clients {
		var rt http.RoundTripper
		if l.transport != nil {
			rt = l.transport(i)
		}
		c, tr := newIdemClient(rt)
		wg.Go(func() {
			defer tr.CloseIdleConnections()
			for o := range ch {
				send(ctx, c, l.base, o, func() {
					n := l.answered.Add(1)
					if l.onAnswer != nil {
						l.onAnswer(n)
					}
				})
			}
		})
	}
feed:
	for i, o := range l.orders {
		if l.gate != nil && !l.gate(ctx, i) {
			break
		}
		select {
		case ch <- o:
		case <-ctx.Done():
			break feed
		}
	}
	close(ch)
	wg.Wait()
}

// replay posts every answered order again with its key: the answer must be
// the stored 201 (Idempotent-Replayed), naming the same order.
func replay(ctx context.Context, base string, orders []*order) {
	ch := make(chan *order)
	var wg sync.WaitGroup
	for range 8 {
		c, tr := newIdemClient(nil)
		wg.Go(func() {
			defer tr.CloseIdleConnections()
			for o := range ch {
				if !send(ctx, c, base, o, func() {}) {
					o.mu.Lock()
					o.notReplay = true
					o.mu.Unlock()
				}
			}
		})
	}
	for _, o := range orders {
		if o.firstID() != 0 {
			ch <- o
		}
	}
	close(ch)
	wg.Wait()
}

// failover is a RoundTripper that sends to the first of its hosts that
// answers: after a transport error it moves to the next one (the same
// request, so the same key, goes there on idemclient's retry).
type failover struct {
	rt    http.RoundTripper
	mu    sync.Mutex
	hosts []string // host:port
	cur   int
}

func (f *failover) RoundTrip(req *http.Request) (*http.Response, error) {
	f.mu.Lock()
	host := f.hosts[f.cur]
	f.mu.Unlock()
	r := req.Clone(req.Context())
	r.URL.Host, r.Host = host, host
	resp, err := f.rt.RoundTrip(r)
	if err != nil && req.Context().Err() == nil {
		f.mu.Lock()
		if f.hosts[f.cur] == host {
			f.cur = (f.cur + 1) % len(f.hosts)
		}
		f.mu.Unlock()
	}
	return resp, err
}

// killPlan schedules the kills (or outages) of a scenario of n orders in
// the middle of its load: kill k happens when points[k] orders are
// answered, evenly spread, the first at n/(kills+2) (a third for one
// kill). So that a slow kill (a failover being measured) does not let the
// load run out before the next one, the feeder hands out at most slack
// orders past the next point until the kill before it is handled.
type killPlan struct {
	points  []int64
	slack   int
	trigger chan struct{}
	mu      sync.Mutex
	handled int
	changed chan struct{} // closed when handled changes
	atKill  []int64       // orders answered when each kill began
}

func newKillPlan(n, kills, clients int) *killPlan {
	k := &killPlan{slack: 2 * clients, trigger: make(chan struct{}, kills), changed: make(chan struct{})}
	for i := 1; i <= kills; i++ {
		k.points = append(k.points, int64(n*i/(kills+2)))
	}
	return k
}

// answered is the load's onAnswer.
func (k *killPlan) answered(n int64) {
	if slices.Contains(k.points, n) {
		k.trigger <- struct{}{}
	}
}

// gate is the load's gate: it waits until order i may be handed out.
func (k *killPlan) gate(ctx context.Context, i int) bool {
	for {
		k.mu.Lock()
		h, ch := k.handled, k.changed
		k.mu.Unlock()
		if h >= len(k.points) || int64(i) < k.points[h]+int64(k.slack) {
			return true
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

// each runs kill for every point, once the load reaches it, until ctx ends
// or kill returns false; kill gets the kill's index.
func (k *killPlan) each(ctx context.Context, l *load, kill func(i int) bool) {
	for i := range k.points {
		select {
		case <-k.trigger:
		case <-ctx.Done():
			return
		}
		k.mu.Lock()
		k.atKill = append(k.atKill, l.answered.Load())
		k.mu.Unlock()
		ok := kill(i)
		k.mu.Lock()
		k.handled++
		close(k.changed)
		k.changed = make(chan struct{})
		k.mu.Unlock()
		if !ok {
			return
		}
	}
}

// last is the number of orders answered when the last kill began.
func (k *killPlan) last() int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.atKill[len(k.atKill)-1]
}

// check makes sure the kills happened in the middle of the load (of n
// orders, answered of them answered): otherwise the scenario would pass
// without testing anything.
func (k *killPlan) check(t *testing.T, n int, answered int64) {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.atKill) != len(k.points) {
		t.Errorf("harness: %d of %d kills happened during the load", len(k.atKill), len(k.points))
	}
	for _, a := range k.atKill {
		if a <= 0 || a >= int64(n) {
			t.Errorf("harness: a kill at %d of %d orders answered is not in the middle of the load", a, n)
		}
	}
	if len(k.atKill) > 0 && answered <= k.atKill[len(k.atKill)-1] {
		t.Errorf("harness: no order answered after the last kill (%d answered)", answered)
	}
}

// ---------------------------------------------------------------------------
// Invariants

// expectation is what a scenario checks once the load is over.
type expectation struct {
	orders    []*order
	customers int
	state     stateReader
	// base returns the URL of a live idemd, for the summaries.
	base  func() string
	exits func() []string
	// pipeline, if set, describes where the events are when the
	// invariants do not hold.
	pipeline *pipeline
}

// report is the outcome of one check of the invariants.
type report struct {
	ops, answered, twoIDs  int
	dbOrders, strangers    int
	created, wrongStatus   int
	confirmed, rejected    int
	wantConf, wantRej      int
	badPayment, payNotConf int
	summaryWrong           int
	customers              int
	exits                  []string
	details                []string
}

func (r *report) ok() bool {
	return r.answered == r.ops && r.twoIDs == 0 && r.dbOrders == r.ops && r.strangers == 0 &&
		r.created == 0 && r.wrongStatus == 0 && r.badPayment == 0 && r.payNotConf == 0 &&
		r.summaryWrong == 0 && len(r.exits) == 0
}

func (r *report) detail(format string, args ...any) {
	if len(r.details) < 30 {
		r.details = append(r.details, fmt.Sprintf(format, args...))
	}
}

// table renders the report as a table, wrong rows marked, then details.
func (r *report) table() string {
	var b strings.Builder
	row := func(name string, want, got int) {
		mark := ""
		if want != got {
			mark = "   <-- wrong"
		}
		fmt.Fprintf(&b, "  %-46s %7d %7d%s\n", name, want, got, mark)
	}
	fmt.Fprintf(&b, "  %-46s %7s %7s\n", "invariant", "want", "got")
	row("orders answered 2xx (201)", r.ops, r.answered)
	row("keys with two ids", 0, r.twoIDs)
	row("orders in the database", r.ops, r.dbOrders)
	row("orders no key was answered with", 0, r.strangers)
	row("orders left CREATED", 0, r.created)
	row("orders with the wrong final status", 0, r.wrongStatus)
	row("CONFIRMED orders without exactly 1 payment", 0, r.badPayment)
	row("payments for non-confirmed orders", 0, r.payNotConf)
	row(fmt.Sprintf("customers whose summary is wrong (of %d)", r.customers), 0, r.summaryWrong)
	row("idemd processes that exited by themselves", 0, len(r.exits))
	fmt.Fprintf(&b, "  (orders CONFIRMED %d of %d expected, REJECTED %d of %d expected)\n", r.confirmed, r.wantConf, r.rejected, r.wantRej)
	for _, e := range r.exits {
		b.WriteString("  - " + e + "\n")
	}
	for _, d := range r.details {
		b.WriteString("  - " + d + "\n")
	}
	return b.String()
}

// check checks the invariants once.
func check(ctx context.Context, e expectation) *report {
	r := &report{ops: len(e.orders), customers: e.customers}
	if e.exits != nil {
		r.exits = e.exits()
	}
	byID := map[int64]*order{}
	for _, o := range e.orders {
		if wantStatus(o.amount) == "CONFIRMED" {
			r.wantConf++
		} else {
			r.wantRej++
		}
		o.mu.Lock()
		ids := slices.Compact(slices.Sorted(slices.Values(o.ids)))
		status, lastErr := o.status, o.lastErr
		notReplay := o.notReplay
		o.mu.Unlock()
		switch {
		case len(ids) == 0:
			r.detail("key %s: no 201 (last status %d, last error %q)", o.key, status, lastErr)
		case len(ids) > 1:
			r.answered++
			r.twoIDs++
			r.detail("key %s: answered with the orders %v", o.key, ids)
		default:
			r.answered++
			if notReplay {
				r.detail("key %s: a retry after the load was answered 201 without Idempotent-Replayed: true", o.key)
			}
		}
		for _, id := range ids {
			byID[id] = o
		}
	}

	st, err := e.state(ctx)
	if err != nil {
		r.dbOrders = -1
		r.detail("read the database: %v", err)
		return r
	}
	r.dbOrders = len(st.orders)
	payments := map[string][]dbPayment{}
	for _, p := range st.payments {
		if p.provider == "idemd-saga" {
			payments[p.external] = append(payments[p.external], p)
		}
	}
	byCustomer := map[int64][]dbOrder{}
	known := map[string]bool{}
	for _, o := range st.orders {
		byCustomer[o.customer] = append(byCustomer[o.customer], o)
		ext := "order-" + strconv.FormatInt(o.id, 10)
		known[ext] = true
		if op := byID[o.id]; op == nil {
			r.strangers++
			r.detail("order %d (customer %d, %s) is no key's answer", o.id, o.customer, o.amount.StringFixed(4))
		} else if op.customer != o.customer || !op.amount.Equal(o.amount) {
			r.strangers++
			r.detail("order %d is customer %d, %s; its key %s asked for customer %d, %s",
				o.id, o.customer, o.amount.StringFixed(4), op.key, op.customer, op.amount.StringFixed(4))
		}
		want := wantStatus(o.amount)
		switch o.status {
		case "CONFIRMED":
			r.confirmed++
		case "REJECTED":
			r.rejected++
		}
		switch {
		case o.status == "CREATED":
			r.created++
		case o.status != want:
			r.wrongStatus++
			r.detail("order %d of %s is %s, want %s", o.id, o.amount.StringFixed(4), o.status, want)
		}
		ps := payments[ext]
		if o.status == "CONFIRMED" {
			switch {
			case len(ps) != 1:
				r.badPayment++
				r.detail("CONFIRMED order %d has %d payments %s", o.id, len(ps), ext)
			case !ps[0].amount.Equal(o.amount) || ps[0].customer != o.customer:
				r.badPayment++
				r.detail("CONFIRMED order %d (customer %d, %s) has the payment %d of customer %d, %s",
					o.id, o.customer, o.amount.StringFixed(4), ps[0].id, ps[0].customer, ps[0].amount.StringFixed(4))
			case o.paymentID == nil || *o.paymentID != ps[0].id:
				r.badPayment++
				r.detail("CONFIRMED order %d has payment_id %v, its payment is %d", o.id, ptrString(o.paymentID), ps[0].id)
			}
		} else if len(ps) > 0 {
			r.payNotConf++
			r.detail("%s order %d has %d payments %s", o.status, o.id, len(ps), ext)
		}
	}
	for ext, ps := range payments {
		if !known[ext] {
			r.payNotConf++
			r.detail("%d payments %s for no order", len(ps), ext)
		}
	}

	hc := &http.Client{Timeout: 10 * time.Second}
	for c := int64(1); c <= int64(e.customers); c++ {
		status, body, err := getSummary(ctx, hc, e.base(), c)
		if err != nil {
			r.summaryWrong++
			r.detail("customer %d summary: %v", c, err)
			continue
		}
		if diff := summaryDiff(c, byCustomer[c], status, body); diff != "" {
			r.summaryWrong++
			r.detail("customer %d summary: %s", c, diff)
		}
	}
	return r
}

func ptrString(p *int64) string {
	if p == nil {
		return "NULL"
	}
	return strconv.FormatInt(*p, 10)
}

func getSummary(ctx context.Context, hc *http.Client, base string, customer int64) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/v1/customers/%d/summary", base, customer), nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// summaryDiff compares a customer's GET /v1/customers/{id}/summary (status
// and body) with what the customer's orders (rows of customer_order) say,
// and describes the differences ("" when there are none). This is the one
// place that knows the summary's shape:
//
//	{"customer_id": 42, "orders": 3, "pending": 0, "confirmed": 2, "rejected": 1,
//	 "total_amount": "19.9000", "last_order_id": "17"}
//
// orders counts all the orders; pending, confirmed and rejected count them
// by status (CREATED, CONFIRMED, REJECTED); total_amount sums the CONFIRMED
// amounts, with 4 decimals; last_order_id is the highest order id, as a
// string. Fields besides these are ignored.
func summaryDiff(customer int64, orders []dbOrder, status int, body []byte) string {
	if len(orders) == 0 {
		if status == http.StatusNotFound {
			return ""
		}
		return fmt.Sprintf("%d %s, want 404 (no order)", status, clip(string(body), 200))
	}
	if status != http.StatusOK {
		return fmt.Sprintf("%d %s, want 200", status, clip(strings.TrimSpace(string(body)), 200))
	}
	var pending, confirmed, rejected int
	total := decimal.Zero
	var last int64
	for _, o := range orders {
		switch o.status {
		case "CREATED":
			pending++
		case "CONFIRMED":
			confirmed++
			total = total.Add(o.amount)
		case "REJECTED":
			rejected++
		}
		last = max(last, o.id)
	}
	want := []struct {
		field string
		value any
	}{
		{"customer_id", customer},
		{"orders", len(orders)},
		{"pending", pending},
		{"confirmed", confirmed},
		{"rejected", rejected},
		{"total_amount", total.StringFixed(4)},
		{"last_order_id", strconv.FormatInt(last, 10)},
	}
	var got map[string]json.RawMessage
	if err := json.Unmarshal(body, &got); err != nil {
		return fmt.Sprintf("not a JSON object: %s", clip(string(body), 200))
	}
	var diffs []string
	for _, w := range want {
		wb, _ := json.Marshal(w.value)
		g, ok := got[w.field]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%s missing (want %s)", w.field, wb))
		case string(bytes.TrimSpace(g)) != string(wb):
			diffs = append(diffs, fmt.Sprintf("%s %s, want %s", w.field, g, wb))
		}
	}
	return strings.Join(diffs, "; ")
}

// awaitInvariants checks the invariants until they hold or within has
// passed, then reports what is wrong as a table.
func awaitInvariants(t *testing.T, e expectation, within time.Duration) {
	t.Helper()
	start := time.Now()
	limit := 3 * within
	ctx, cancel := context.WithTimeout(context.Background(), limit+30*time.Second)
	defer cancel()
	var (
		moved   = start // when the orders left CREATED last went down
		settled = -1    // their count then
	)
	for {
		r := check(ctx, e)
		if r.ok() {
			took := time.Since(start)
			t.Logf("invariants hold %.1f s after the load: %d orders, %d CONFIRMED, %d REJECTED, %d customers' summaries right",
				took.Seconds(), r.ops, r.confirmed, r.rejected, r.customers)
			if took > within {
				t.Logf("the backlog took longer than the %.0f s a quiet machine needs, and went down all along (never %.0f s without progress): the machine was busy",
					within.Seconds(), progressStall.Seconds())
			}
			return
		}
		if settled < 0 || r.created < settled {
			settled, moved = r.created, time.Now()
		}
		// Past within, waiting goes on only while the backlog goes
		// down: a loaded machine drains it slower, a stalled pipeline
		// does not drain it at all.
		stalled := time.Since(moved) > progressStall
		if time.Since(start) > limit || (time.Since(start) > within && stalled) {
			why := fmt.Sprintf("%d orders left CREATED, none of them settled in the last %.0f s", r.created, time.Since(moved).Seconds())
			if !stalled {
				why = fmt.Sprintf("still draining at %.0f s, three times the %.0f s bound", time.Since(start).Seconds(), within.Seconds())
			}
			where := ""
			if e.pipeline != nil {
				where = e.pipeline.describe(context.Background())
			}
			t.Errorf("invariants still broken %.0f s after the load (%s):\n%s%s", time.Since(start).Seconds(), why, r.table(), where)
			return
		}
		time.Sleep(time.Second)
	}
}

// progressStall is how long the orders left CREATED may stay as many
// once awaitInvariants waits past its bound.
const progressStall = 15 * time.Second

// quiescence is how long the invariants may take to hold after a load of n
// orders.
func quiescence(n int) time.Duration {
	return max(45*time.Second, time.Duration(n)*15*time.Millisecond)
}

// loadTimeout bounds the load of n orders with kills kills.
func loadTimeout(n, kills int) time.Duration {
	return 90*time.Second + time.Duration(kills)*30*time.Second + time.Duration(n)*20*time.Millisecond
}
