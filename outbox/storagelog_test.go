package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/outbox"
)

// outageDriver is a database that is down for a number of rounds: the
// first call of a round (Begin on PostgreSQL, where the claim runs in the
// round's transaction; the claim on SQLite) fails while it is down, and so
// does the lag query. Each failed round moves the clock on by a second.
type outageDriver[TTx any] struct {
	driver.OutboxDriver[TTx]
	clock *fakeClock
	// left is the number of rounds left to fail (negative: the rounds
	// since the database came back).
	left atomic.Int64
	// changeAt is the number of rounds left when the error changes (the
	// server starting up after refusing connections); 0 for never.
	changeAt int64
	// notMigrated makes the rounds fail on idem's tables missing instead
	// (driver.ErrNotMigrated): no passing failure.
	notMigrated bool
	// straggler, if set, makes the first round after the outage one that
	// was in flight through the recovery: it fails once straggler is
	// closed.
	straggler chan struct{}
	// okStep is how far a round that goes through moves the clock on
	// (runOutage: a second, as a failed one).
	okStep time.Duration
	// flapping makes every other round fail, on too many connections
	// (SQLSTATE 53300: a role's CONNECTION LIMIT), while it is set;
	// flaps counts its rounds.
	flapping atomic.Bool
	flaps    atomic.Int64

	// turns, if set (Run's workers, outageWorkers on PostgreSQL), makes
	// the workers' rounds take turns: a round starts once every other
	// worker is back at the start of its next one, after its round's line.
	// The clock moves a second a round, of any worker: a worker the machine
	// held between its round and its line would read the time of the other
	// worker's later rounds (a repeat of the outage's last "connection
	// refused" round logged at 91 s, once the failure had changed, as a
	// third summary). stopped (runOutage's) ends the waits: the round
	// then fails with its context, done once the relay's is.
	turns   int
	turnMu  sync.Mutex
	waiting []chan struct{}
	stopped <-chan struct{}
}

// turn waits for the round's turn (see turns), on ctx, the round's; its
// error once the relay is stopped.
func (d *outageDriver[TTx]) turn(ctx context.Context) error {
	if d.turns == 0 {
		return nil
	}
	mine := make(chan struct{})
	d.turnMu.Lock()
	d.waiting = append(d.waiting, mine)
	if len(d.waiting) == d.turns { // every worker is here: the first to come goes
		close(d.waiting[0])
		d.waiting = d.waiting[1:]
	}
	d.turnMu.Unlock()
	select {
	case <-mine:
		return nil
	case <-d.stopped:
		// Not before ctx ends: the relay's context, of which stopped is
		// the Done, is done before the round's (a round failing before
		// would be logged).
		<-ctx.Done()
		return ctx.Err()
	}
}

func (d *outageDriver[TTx]) down() bool { return d.left.Load() >= 0 }

// round starts a round: it fails while the database is down, with a local
// port that changes from one round to the next (the same failure).
func (d *outageDriver[TTx]) round(ctx context.Context) error {
	if err := d.turn(ctx); err != nil {
		return err
	}
	if d.flapping.Load() {
		d.clock.Add(time.Second)
		if d.flaps.Add(1)%2 == 0 {
			return &pgconn.PgError{Severity: "FATAL", Code: "53300", Message: `too many connections for role "idemd"`}
		}
		return nil
	}
	n := d.left.Add(-1)
	if n == -1 && d.straggler != nil {
		<-d.straggler
		return refused(39999)
	}
	if n < 0 {
		d.clock.Add(d.okStep) // after the straggler's start
		return nil
	}
	d.clock.Add(time.Second)
	if n < d.changeAt {
		return &pgconn.PgError{Severity: "FATAL", Code: "57P03", Message: fmt.Sprintf("the database system is starting up [conn %d]", n)}
	}
	if d.notMigrated {
		return fmt.Errorf("outbox: claim: %w", driver.ErrNotMigrated)
	}
	return refused(40000 + int(n))
}

// refused is the error of a connection to the database refused, from the
// local port port.
func refused(port int) error {
	return &net.OpError{Op: "dial", Net: "tcp",
		Source: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 5), Port: port},
		Addr:   &net.TCPAddr{IP: net.IPv4(10, 0, 0, 9), Port: 5432},
		Err:    errors.New("connect: connection refused")}
}

func (d *outageDriver[TTx]) Begin(ctx context.Context) (TTx, error) {
	if err := d.round(ctx); err != nil {
		var zero TTx
		return zero, err
	}
	return d.OutboxDriver.Begin(ctx)
}

func (d *outageDriver[TTx]) Outbox() driver.OutboxExecutor {
	return outageExecutor[TTx]{d.OutboxDriver.Outbox(), d}
}

// Locks passes the relay lease through (as a wrapper of a SQLite driver
// must, or nothing keeps a second relay off its outbox): the outage is in
// the outbox's statements.
func (d *outageDriver[TTx]) Locks() driver.LockExecutor {
	return d.OutboxDriver.(driver.LockStore).Locks()
}

type outageExecutor[TTx any] struct {
	driver.OutboxExecutor
	d *outageDriver[TTx]
}

func (e outageExecutor[TTx]) OutboxClaimBatch(ctx context.Context, p *driver.OutboxClaimBatchParams) ([]driver.OutboxRow, error) {
	if err := e.d.round(ctx); err != nil {
		return nil, err
	}
	return e.OutboxExecutor.OutboxClaimBatch(ctx, p)
}

func (e outageExecutor[TTx]) OutboxOldestUnpublished(ctx context.Context) (time.Time, bool, error) {
	if e.d.down() {
		return time.Time{}, false, fmt.Errorf("dial tcp 10.0.0.5:%d->10.0.0.9:5432: connect: connection refused", 40000+e.d.left.Load())
	}
	return e.OutboxExecutor.OutboxOldestUnpublished(ctx)
}

// A database outage of 100 rounds, one a second, in Run (two workers on
// PostgreSQL): the first failed round is logged at once, at WARN (a
// passing failure: connections refused), as is the first round that fails
// otherwise (the server starting up, 10 rounds before the end); their
// repeats are summarised at ERROR at most every 30 s, with the number of
// rounds not logged; and one INFO line says the rounds succeed again,
// after how many failed rounds and how long. It logged an ERROR per round.
func TestRelayLogsADatabaseOutageOnce(t *testing.T) {
	t.Parallel()
	t.Run("SQLite", func(t *testing.T) { testOutageLog(t, testdb.SQLite(t)) })
	t.Run("PostgreSQL", func(t *testing.T) { testOutageLog(t, testdb.Postgres(t)) })
}

func testOutageLog[TTx any](t *testing.T, db driver.OutboxDriver[TTx]) {
	t.Parallel()
	const failedRounds = 100
	var (
		logs  testlog.Buffer
		clock = &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		drv   = &outageDriver[TTx]{OutboxDriver: db, clock: clock, changeAt: 10}
	)
	if db.Caps().ConcurrentWriters {
		drv.turns = outageWorkers
	}
	drv.left.Store(failedRounds)
	stop := runOutage(t, drv, &logs)
	// Three rounds begun after the outage (a worker finished a successful
	// round; on PostgreSQL, two workers), and 10 s (of the clock) of rounds
	// without a failure: the recovery logged.
	// 100 rounds take a second or two; 31 were left after 10 s in a run
	// with the machine busy: the deadline only waits.
	deadline := time.Now().Add(60 * time.Second)
	for (drv.left.Load() > -3 || !strings.Contains(logs.String(), "succeed again")) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if drv.left.Load() > -3 {
		t.Fatalf("%d rounds left to fail after 60 s", drv.left.Load())
	}

	var firsts, summaries, recoveries []logLine
	for _, l := range logLines(t, &logs) {
		switch {
		case l.Level == "WARN" && l.Msg == "outbox: relay round failed":
			firsts = append(firsts, l)
		case l.Level == "ERROR" && strings.HasPrefix(l.Msg, "outbox: relay rounds still failing"):
			summaries = append(summaries, l)
		case l.Level == "INFO" && strings.HasPrefix(l.Msg, "outbox: relay rounds succeed again"):
			recoveries = append(recoveries, l)
		default:
			t.Errorf("unexpected log line %+v", l)
		}
	}
	if len(firsts) != 2 || !strings.Contains(firsts[0].Err, "connection refused") || firsts[0].ConsecutiveFailures != 1 ||
		!strings.Contains(firsts[1].Err, "starting up") {
		t.Fatalf("%d WARN lines for a first failed round (%+v); want 2: connection refused, then starting up", len(firsts), firsts)
	}
	// Connections refused at 1..90 s: logged at 1 s, summarised at about
	// 31 and 61 s (a second more or less: two workers share the failure on
	// PostgreSQL) with the rounds in between.
	if len(summaries) != 2 {
		t.Fatalf("%d summaries (%+v); want 2, at about 31 and 61 s", len(summaries), summaries)
	}
	for i, s := range summaries {
		if s.Suppressed < 28 || s.Suppressed > 30 || s.FailedRounds < 30*(i+1) || s.FailedRounds > 30*(i+1)+2 ||
			!strings.Contains(s.Err, "connection refused") || s.RetryIn == 0 {
			t.Errorf("summary %d: %+v; want about 29 suppressed, %d failed rounds, the error and retry_in", i, s, 30*(i+1)+1)
		}
	}
	if len(recoveries) != 1 {
		t.Fatalf("%d recovery lines (%+v); want 1", len(recoveries), recoveries)
	}
	if r := recoveries[0]; r.FailedRounds != failedRounds || time.Duration(r.Over) < (failedRounds-2)*time.Second {
		t.Errorf("recovery: %+v; want %d failed rounds over about %s", r, failedRounds, (failedRounds-1)*time.Second)
	}
}

// A database that refuses the relay's connections for 5 s (a restart, a
// failover, a killed connection) and comes back is a WARN line and an INFO
// line: nothing for an on-call engineer to act on, and no ERROR. Only an
// outage that lasts (the summary, at 30 s) is an ERROR, and so is a
// failure a retry does not fix (idem's tables missing) at once.
func TestRelayLogsAShortOutageWithoutError(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name        string
		notMigrated bool
		want        string // the level of the first failed round's line
	}{
		{"connections refused", false, "WARN"},
		{"tables missing", true, "ERROR"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var (
				logs  testlog.Buffer
				clock = &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
				drv   = &outageDriver[pgx.Tx]{OutboxDriver: testdb.Postgres(t), clock: clock, notMigrated: c.notMigrated}
			)
			drv.left.Store(5)
			stop := runOutage(t, drv, &logs)
			deadline := time.Now().Add(10 * time.Second)
			for (drv.left.Load() > -3 || !strings.Contains(logs.String(), "succeed again")) && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			stop()
			levels := map[string][]string{}
			for _, l := range logLines(t, &logs) {
				levels[l.Level] = append(levels[l.Level], l.Msg)
			}
			first := levels[c.want]
			if len(first) != 1 || first[0] != "outbox: relay round failed" {
				t.Errorf("%s lines %q; want the first failed round's alone", c.want, first)
			}
			if c.want == "WARN" && len(levels["ERROR"]) > 0 {
				t.Errorf("ERROR lines %q for a 5 s outage; want none", levels["ERROR"])
			}
			if got := levels["INFO"]; len(got) != 1 || !strings.HasPrefix(got[0], "outbox: relay rounds succeed again") {
				t.Errorf("INFO lines %q; want the recovery alone", got)
			}
		})
	}
}

// With two workers (PostgreSQL), a round begun before the database came
// back that fails after the other worker's round logged the recovery was in
// flight through it: it is not logged as a new failure (followed by a
// second recovery line).
func TestRelayRoundInFlightThroughRecovery(t *testing.T) {
	t.Parallel()
	var (
		logs  testlog.Buffer
		clock = &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		drv   = &outageDriver[pgx.Tx]{OutboxDriver: testdb.Postgres(t), clock: clock, straggler: make(chan struct{})}
	)
	drv.left.Store(5)
	stop := runOutage(t, drv, &logs)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "succeed again") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	close(drv.straggler)
	for drv.left.Load() > -5 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	var failed, recovered int
	for _, l := range logLines(t, &logs) {
		switch {
		case l.Msg == "outbox: relay round failed":
			failed++
		case strings.HasPrefix(l.Msg, "outbox: relay rounds succeed again"):
			recovered++
		}
	}
	if failed != 1 || recovered != 1 {
		t.Fatalf("%d failure and %d recovery lines; want 1 and 1 (the straggler is part of the outage); logs:\n%s", failed, recovered, logs.String())
	}
}

// While the lag query fails (the database down, 70 rounds of RunOnce, one
// a second), "lag unknown" is logged once, then summarised at most every
// 30 s; once it succeeds (an INFO line once none failed for 10 s), OnLag
// is called again. It logged a WARN per query.
func TestRelayLogsUnknownLagOnce(t *testing.T) {
	t.Parallel()
	t.Run("SQLite", func(t *testing.T) { testUnknownLagLog(t, testdb.SQLite(t)) })
	t.Run("PostgreSQL", func(t *testing.T) { testUnknownLagLog(t, testdb.Postgres(t)) })
}

func testUnknownLagLog[TTx any](t *testing.T, db driver.OutboxDriver[TTx]) {
	t.Parallel()
	const failedRounds = 70
	var (
		logs    testlog.Buffer
		clock   = &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		drv     = &outageDriver[TTx]{OutboxDriver: db, clock: clock}
		reports atomic.Int32
	)
	drv.left.Store(failedRounds)
	relay, err := outbox.NewRelay[TTx](drv, outbox.PublisherFunc(func(context.Context, []event.Envelope) error { return nil }), &outbox.RelayConfig{
		OnLag:  func(time.Duration) { reports.Add(1) },
		Now:    clock.Now,
		Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	drv.okStep = time.Second
	// The outage, then 10 s of queries that succeed: the recovery is
	// logged once none failed for 10 s.
	const okRounds = 10
	for i := range failedRounds + okRounds {
		_, err := relay.RunOnce(t.Context())
		if (err != nil) != (i < failedRounds) {
			t.Fatalf("round %d: RunOnce = %v", i, err)
		}
		if i == failedRounds+okRounds-2 && strings.Contains(logs.String(), "lag known again") {
			t.Fatalf("the recovery logged %d s after the last failed query; want 10 s", okRounds-1)
		}
	}
	if n := reports.Load(); n != okRounds {
		t.Errorf("OnLag called %d times; want %d, after the outage", n, okRounds)
	}

	var warns, summaries, recoveries []logLine
	for _, l := range logLines(t, &logs) {
		switch {
		case l.Level == "WARN" && l.Msg == "outbox: lag unknown":
			warns = append(warns, l)
		case l.Level == "WARN" && strings.HasPrefix(l.Msg, "outbox: lag still unknown"):
			summaries = append(summaries, l)
		case l.Level == "INFO" && strings.HasPrefix(l.Msg, "outbox: lag known again"):
			recoveries = append(recoveries, l)
		default:
			t.Errorf("unexpected log line %+v", l)
		}
	}
	if len(warns) != 1 || !strings.Contains(warns[0].Err, "connection refused") {
		t.Fatalf("%d WARN lines for the first failed lag query (%+v); want 1, with the error", len(warns), warns)
	}
	if len(summaries) != 2 {
		t.Fatalf("%d summaries (%+v); want 2, at 31 and 61 s", len(summaries), summaries)
	}
	for i, s := range summaries {
		if s.Suppressed != 29 || s.FailedQueries != 30*(i+1)+1 || !strings.Contains(s.Err, "connection refused") {
			t.Errorf("summary %d: %+v; want 29 suppressed, %d failed queries and the error", i, s, 30*(i+1)+1)
		}
	}
	over := (failedRounds - 1 + okRounds) * time.Second
	if len(recoveries) != 1 || recoveries[0].FailedQueries != failedRounds || time.Duration(recoveries[0].Over) != over {
		t.Errorf("recovery lines %+v; want 1, after %d failed queries over %s", recoveries, failedRounds, over)
	}
}

// outageWorkers is the number of Run's workers of runOutage on PostgreSQL
// (on SQLite, one).
const outageWorkers = 2

// runOutage runs a relay of drv (publishing to nowhere, retrying at once,
// on drv's clock, logging to logs) until the returned stop is called; stop
// waits for Run and fails the test on its error.
func runOutage[TTx any](t *testing.T, drv *outageDriver[TTx], logs *testlog.Buffer) (stop func()) {
	t.Helper()
	drv.okStep = time.Second
	relay, err := outbox.NewRelay[TTx](drv, outbox.PublisherFunc(func(context.Context, []event.Envelope) error { return nil }), &outbox.RelayConfig{
		Backoff:      func(int) time.Duration { return 0 }, // retried after 10 ms
		Concurrency:  outageWorkers,
		PollInterval: 10 * time.Millisecond,
		Now:          drv.clock.Now,
		Logger:       slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	drv.stopped = ctx.Done()
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	return func() {
		t.Helper()
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// A database short of connections (a role's CONNECTION LIMIT, SQLSTATE
// 53300) fails every other round of Run for 200 rounds, one a second: the
// relay logs one line when the failures start, a summary every 30 s (the
// failed rounds and those that went through), and one line once no round
// failed for 10 s. It logged a WARN and an INFO per failed round.
func TestRelayLogsFlappingRoundsOnce(t *testing.T) {
	t.Parallel()
	t.Run("SQLite", func(t *testing.T) { testFlappingLog(t, testdb.SQLite(t)) })
	t.Run("PostgreSQL", func(t *testing.T) { testFlappingLog(t, testdb.Postgres(t)) })
}

func testFlappingLog[TTx any](t *testing.T, db driver.OutboxDriver[TTx]) {
	t.Parallel()
	var (
		logs  testlog.Buffer
		clock = &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		drv   = &outageDriver[TTx]{OutboxDriver: db, clock: clock}
	)
	drv.left.Store(-1) // up
	drv.flapping.Store(true)
	stop := runOutage(t, drv, &logs)
	deadline := time.Now().Add(30 * time.Second)
	for drv.flaps.Load() < 200 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	drv.flapping.Store(false)
	for !strings.Contains(logs.String(), "succeed again") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	var firsts, summaries, recoveries []logLine
	for _, l := range logLines(t, &logs) {
		switch {
		case l.Msg == "outbox: relay round failed":
			firsts = append(firsts, l)
		case strings.HasPrefix(l.Msg, "outbox: relay rounds still failing"):
			summaries = append(summaries, l)
		case strings.HasPrefix(l.Msg, "outbox: relay rounds succeed again"):
			recoveries = append(recoveries, l)
		default:
			t.Errorf("unexpected log line %+v", l)
		}
	}
	t.Logf("%d flapping rounds: %d 'round failed', %d 'still failing', %d 'succeed again' lines", drv.flaps.Load(), len(firsts), len(summaries), len(recoveries))
	if len(firsts) != 1 || !strings.Contains(firsts[0].Err, "53300") || len(summaries) < 5 || len(summaries) > 7 || len(recoveries) != 1 {
		t.Fatalf("%d 'round failed', %d 'still failing', %d 'succeed again' lines; want 1, about 6 (one per 30 s over 200 s) and 1; logs:\n%s",
			len(firsts), len(summaries), len(recoveries), logs.String())
	}
	if s := summaries[0]; s.Suppressed < 10 || s.OKRounds < 10 {
		t.Errorf("summary %+v; want the failed rounds not logged and those that went through counted", s)
	}
	if r := recoveries[0]; r.FailedRounds < 95 || r.OKRounds < 100 {
		t.Errorf("recovery %+v; want about 100 failed rounds and 100 and more that went through", r)
	}
}
