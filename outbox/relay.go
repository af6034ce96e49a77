package outbox

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/internal/dberr"
	"github.com/idemkit/idem/internal/flaplog"
	"github.com/idemkit/idem/internal/leaseowner"
	"github.com/idemkit/idem/internal/txnil"
)

// ErrRunning is returned by Run when the relay is already running.
var ErrRunning = errors.New("outbox: relay is already running")

// finishTimeout bounds marking a published batch. The marks run on a context
// detached from the caller's cancellation, so a batch published while the
// relay shuts down is still marked instead of being published again.
const finishTimeout = 15 * time.Second

// holdMargin is added to PublishTimeout and finishTimeout to bound how long
// a claim transaction may stay idle (see holdTimeout).
const holdMargin = 5 * time.Second

// holdTimeout bounds how long a round's claim transaction may stay idle
// (driver.OutboxClaimBatchParams.HoldTimeout: on PostgreSQL,
// idle_in_transaction_session_timeout): a relay stalled while publishing (a
// broker client outliving its context, the network to the database gone)
// has its session ended by the server, and its lanes go to other relays.
func (r *Relay[TTx]) holdTimeout() time.Duration {
	return r.cfg.PublishTimeout + finishTimeout + holdMargin
}

// Relay publishes the events of the outbox. Create it with NewRelay, then
// call Run (the loop) or RunOnce (one batch, for tests and cron-style use).
// Run one Relay per process. On PostgreSQL its Run keeps
// RelayConfig.Concurrency batches in flight at once (each claims its own
// lanes, see driver.OutboxExecutor), and relays in several processes share
// the work safely; on SQLite one batch is in flight at a time, and only the
// relay that holds the database's lease (RelayLockName) publishes, the
// others standing by (see the package doc).
type Relay[TTx any] struct {
	drv driver.OutboxDriver[TTx]
	pub Publisher
	cfg RelayConfig
	// locking: claim, publish and mark in one transaction whose row locks
	// keep other relays off the claimed keys. Without concurrent writers
	// (SQLite) a long transaction would hold the database's only write
	// lock while publishing, so the batch is read without one and marked in
	// a short transaction instead.
	locking bool

	mu      sync.Mutex // one round at a time, without locking (SQLite)
	running atomic.Bool
	lagAt   atomic.Int64 // unix nanoseconds of the last lag report
	// failures limits the warnings of publish failures that repeat.
	failures failureLog
	// storage limits the errors of Run's rounds that fail in the database
	// (grouped by error text, shared by the workers), lag the warnings of
	// the lag queries that fail (one failure whatever the text).
	storage, lag failureLog
	// listener limits the warnings of the wake-up listener's failed
	// reconnections (one failure whatever the text).
	listener failureLog
	// storageBackAt is when (cfg.Now, unix nanoseconds) a round of Run
	// last logged that the database answers again: a round that began
	// before it and failed was in flight through the recovery, not a new
	// failure.
	storageBackAt atomic.Int64
	// publishOutage is set when a round of Run failed as a whole in the
	// publisher (the broker was down), and cleared by the first round of
	// any worker that publishes after it, which makes the events backing
	// off due at once (retryBackedOff).
	publishOutage atomic.Bool

	// lease, on a backend without concurrent writers, is the lease that
	// lets one relay of the database publish at a time (nil on PostgreSQL,
	// and on a driver without a lock table); leaseUntil is when it expires
	// unless renewed (wall clock, unix nanoseconds).
	lease      *relayLease
	leaseUntil atomic.Int64

	// latePub is pub when it is a LatePublisher (nil otherwise); late
	// holds the outcomes it reported late, applied by applyLate (one at a
	// time: lateMu).
	latePub LatePublisher
	late    *lateQueue
	lateMu  sync.Mutex
	// lateGate: rounds hold it shared, markLate exclusively.
	lateGate sync.RWMutex
}

// NewRelay returns a relay that publishes the outbox of drv through pub.
// cfg may be nil; see RelayConfig for the defaults.
func NewRelay[TTx any](drv driver.OutboxDriver[TTx], pub Publisher, cfg *RelayConfig) (*Relay[TTx], error) {
	if txnil.Is(drv) { // nil, or a nil *Driver from an Open whose error was ignored
		return nil, errors.New("outbox: nil driver")
	}
	if pub == nil {
		return nil, errors.New("outbox: nil publisher")
	}
	var c RelayConfig
	if cfg != nil {
		c = *cfg
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	r := &Relay[TTx]{
		drv:      drv,
		pub:      pub,
		cfg:      c.withDefaults(drv.Caps().ConcurrentWriters),
		locking:  drv.Caps().ConcurrentWriters,
		lag:      failureLog{anyText: true},
		listener: failureLog{anyText: true},
	}
	if lp, ok := pub.(LatePublisher); ok {
		r.latePub = lp
		r.late = &lateQueue{signal: make(chan struct{}, 1)}
	}
	if !r.locking {
		// Claims read outside a transaction: two relays would read the
		// same events. One publishes at a time, under a lease.
		if ls, ok := any(drv).(driver.LockStore); ok {
			r.lease = &relayLease{ex: ls.Locks(), owner: leaseowner.New()}
		}
	}
	return r, nil
}

// Notifier is implemented by drivers that signal committed outbox inserts
// (pgdriver and pgsqldriver, with LISTEN/NOTIFY): ListenOutbox returns a channel that
// receives a value soon after such a commit, until ctx ends. A Relay whose
// RelayConfig.Wake is nil listens on it by itself: Run calls ListenOutbox
// in the background and polls until it returns (its connection may be
// slow to come), then looks for events once more. If ListenOutbox fails
// (the database restarting), the relay polls and calls it again with
// backoff (up to 5s) until it succeeds; an error wrapping
// errors.ErrUnsupported (a driver that cannot listen, or one configured
// not to notify: driver.ErrOutboxNotifyOff, logged at INFO) makes it poll
// for good. Once started, the listener reports to onError the errors of its
// connection and of its attempts to connect again, and nil once it has
// reconnected: the relay logs the first error at once, then at most one
// line every 30 s with the attempts not logged, and its reconnection.
type Notifier interface {
	ListenOutbox(ctx context.Context, onError func(error)) (<-chan struct{}, error)
}

// StorageBackoffCeiling bounds the pause of Run after a round that failed in
// the database (not in the publisher): the relay must resume within seconds
// of the database's return, however long the outage was.
const StorageBackoffCeiling = 2 * time.Second

// PublishBackoffCeiling bounds the pause of Run after a round whose every
// event the publisher failed or skipped (the broker is down, or a circuit
// breaker is open): the relay tries again at least this often, so that it
// notices the broker's return within seconds, however long the outage was.
// Each failed event still waits RelayConfig.Backoff of its own attempts;
// the first round that publishes again after such a failed round makes the
// events backing off due at once (see the package doc).
//
// A claim that takes long (seconds over a backlog of millions of events
// whose keys all back off) raises that bound to ten times its own
// duration, so that an outage's rounds spend at most about a tenth of the
// time claiming.
const PublishBackoffCeiling = 5 * time.Second

// claimShare is how many times its claim's duration a round the publisher
// failed waits at least, up to Backoff (see PublishBackoffCeiling).
const claimShare = 10

// retryNowBatch is the most backed-off events one OutboxRetryNow call makes
// due, and retryNowTimeout bounds all the calls after an outage.
const (
	retryNowBatch   = 1000
	retryNowTimeout = 30 * time.Second
)

// Run publishes events until ctx is done, then returns nil (or ErrRunning if
// the relay is already running). It never gives up: a failed round is logged
// (a failure that repeats, at most every 30s: see the package doc) and
// retried after RelayConfig.Backoff of the number of consecutive failed
// rounds (at most StorageBackoffCeiling when the database failed, and
// earlier on a RelayConfig.Wake signal; at most PublishBackoffCeiling when
// the publisher did). A round that published some of its events and failed others does
// not count as failed (the broker is up; the failed events wait for their
// own retry, and the other keys go on). The first round that publishes
// after a round the publisher failed as a whole makes every event backing
// off due at once (driver.OutboxExecutor.OutboxRetryNow), whichever relay
// failed it. After a round that claimed events it
// goes on at once; otherwise it waits for RelayConfig.Wake, for the poll interval, or
// for the earliest retry of an event it backed off, whichever comes first.
// On SQLite it publishes only while it holds the relay lease
// (RelayLockName), stands by while another relay holds it, and releases it
// when it returns.
func (r *Relay[TTx]) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer r.running.Store(false)
	// A run's first failed round (and lag query) is logged, even if the
	// last run ended during an outage.
	r.storage.ended()
	r.lag.ended()

	wakeUp := r.cfg.Wake
	if n, ok := any(r.drv).(Notifier); ok && wakeUp == nil && !r.cfg.NoListen {
		// The listener starts in the background while the relay polls:
		// its connection may be slow to come (a pooler queueing it, a
		// server slow to accept), and the relay has its pool's. It ends
		// with Run, also when Run ends by a panic (a supervisor that
		// recovers and runs it again must not leak a listener and its
		// connection per restart).
		lctx, cancel := context.WithCancel(ctx)
		ch := make(chan struct{}, 1)
		wakeUp = ch
		var lwg sync.WaitGroup
		defer lwg.Wait() // after cancel (deferred later, run earlier)
		defer cancel()
		lwg.Go(func() { r.listen(lctx, n, ch) })
	}
	if r.cfg.Wake != nil {
		// A closed Wake receives at once for ever: forwarded, it is taken
		// as the end of the wake-ups, not as one each time (a tight loop
		// of claims).
		fctx, cancel := context.WithCancel(ctx)
		var fwg sync.WaitGroup
		defer fwg.Wait() // after cancel (deferred later, run earlier)
		defer cancel()
		ch := make(chan struct{}, 1)
		wakeUp = ch
		fwg.Go(func() { r.forwardWake(fctx, r.cfg.Wake, ch) })
	}
	if r.late != nil {
		// Late outcomes (see LatePublisher) are applied as they come, and
		// wake the workers: the keys they free are claimable at once.
		// Their wake-ups join the others'.
		lctx, cancel := context.WithCancel(ctx)
		var lwg sync.WaitGroup
		defer lwg.Wait() // after cancel (deferred later, run earlier)
		defer cancel()
		lateWake := make(chan struct{}, 1)
		merged := make(chan struct{}, 1)
		other := wakeUp
		wakeUp = merged
		lwg.Go(func() { r.runLate(lctx, lateWake) })
		lwg.Go(func() {
			for {
				select {
				case <-lctx.Done():
					return
				case <-other:
				case <-lateWake:
				}
				select {
				case merged <- struct{}{}:
				default:
				}
			}
		})
	}
	if r.cfg.OnLag != nil {
		// Rounds report the lag; one that does not end (a Publish
		// outliving its context) must not freeze it.
		lctx, cancel := context.WithCancel(ctx)
		var lwg sync.WaitGroup
		defer lwg.Wait() // after cancel (deferred later, run earlier)
		defer cancel()
		lwg.Go(func() { r.keepReportingLag(lctx) })
	}
	if r.lease != nil {
		r.runLeased(ctx, wakeUp)
		return nil
	}
	// Without a lease, every relay publishes (PostgreSQL's share the
	// lanes): never standing by.
	report := leaseReport{fn: r.cfg.OnLease}
	report.set(true)
	defer report.end()
	if !r.locking {
		r.cfg.Logger.Warn("outbox: the driver has no lock table (driver.LockStore): nothing keeps a second relay of this database from publishing the same events; run one relay per database")
	}
	workers := r.cfg.Concurrency
	if !r.locking {
		workers = 1
	}
	if workers == 1 {
		r.loop(ctx, wakeUp)
		return nil
	}
	// Every worker gets every wake-up: each one may be waiting for new
	// events in lanes the others do not hold.
	wakes := make([]chan struct{}, workers)
	for i := range wakes {
		wakes[i] = make(chan struct{}, 1)
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var (
		wg        sync.WaitGroup
		panicOnce sync.Once
		panicked  bool
		panicVal  any
	)
	if wakeUp != nil {
		wg.Go(func() {
			for {
				select {
				case <-wctx.Done():
					return
				case <-wakeUp:
					for _, w := range wakes {
						select {
						case w <- struct{}{}:
						default:
						}
					}
				}
			}
		})
	}
	for _, w := range wakes {
		var wake <-chan struct{}
		if wakeUp != nil {
			wake = w
		}
		wg.Go(func() {
			// A panic in a worker (a publisher that panics) stops the
			// others and is raised again in Run's goroutine, as it would
			// be with one worker.
			defer func() {
				if p := recover(); p != nil {
					panicOnce.Do(func() { panicked, panicVal = true, p })
					stop()
				}
			}()
			r.loop(wctx, wake)
		})
	}
	wg.Wait()
	if panicked {
		panic(panicVal)
	}
	return nil
}

// listenError is the onError of the relay's listener (Notifier): an
// error of the connection it keeps, or of an attempt to connect again
// (every 5 s at most while the database is down), or nil once it has
// connected again after errors. It logs the first error at once, then at
// most one line every failureLogInterval with the attempts not logged
// (r.listener), and one INFO line once it has reconnected.
func (r *Relay[TTx]) listenError(err error) {
	if err == nil {
		if g, ok := r.listener.ended(); ok {
			r.cfg.Logger.Info("outbox: wake-up listener reconnected",
				"failed_attempts", g.rounds, "over", r.cfg.Now().Sub(g.first), "since", g.first, "err", g.err)
		}
		return
	}
	log, g := r.listener.failed(err.Error(), r.cfg.Now())
	switch {
	case !log:
	case g.rounds == 1:
		r.cfg.Logger.Warn("outbox: wake-up listener lost its connection; polling until it reconnects",
			"err", err, "poll_interval", r.cfg.PollInterval)
	default:
		r.cfg.Logger.Warn("outbox: wake-up listener still reconnecting, polling; repeats are logged at most every "+failureLogInterval.String(),
			"err", err, "suppressed", g.suppressed, "failed_attempts", g.rounds, "since", g.first)
	}
}

// forwardWake forwards the values of RelayConfig.Wake w to wake until ctx
// ends or w is closed.
func (r *Relay[TTx]) forwardWake(ctx context.Context, w <-chan struct{}, wake chan<- struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-w:
			if !ok {
				r.cfg.Logger.Warn("outbox: RelayConfig.Wake was closed; polling only", "poll_interval", r.cfg.PollInterval)
				return
			}
			select {
			case wake <- struct{}{}:
			default:
			}
		}
	}
}

// listenRetryMax bounds the wait between two attempts of listen.
const listenRetryMax = 5 * time.Second

// listen starts the listener of n, retrying with backoff (100ms doubling up
// to listenRetryMax) until it starts or ctx ends, then forwards its
// wake-ups to wake: once at the start (events may have been committed
// before it listened), then each one. An error wrapping
// errors.ErrUnsupported (a driver that cannot listen, or
// driver.ErrOutboxNotifyOff) ends it: the relay polls for good.
func (r *Relay[TTx]) listen(ctx context.Context, n Notifier, wake chan<- struct{}) {
	r.listener.ended() // a failure of an earlier Run's listener is not this one's
	signal := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	var w <-chan struct{}
	attempt := 0
	for ; w == nil; attempt++ {
		if attempt > 0 && !backoff.Sleep(ctx, backoff.Exp(attempt, 100*time.Millisecond, listenRetryMax), nil) {
			return
		}
		var err error
		if w, err = n.ListenOutbox(ctx, r.listenError); err == nil {
			break
		}
		w = nil
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, driver.ErrOutboxNotifyOff):
			// Chosen (the inserts do not notify): nothing to warn about.
			r.cfg.Logger.Info("outbox: the driver's inserts do not notify, polling only", "poll_interval", r.cfg.PollInterval)
			return
		case errors.Is(err, errors.ErrUnsupported):
			r.cfg.Logger.Warn("outbox: no wake-ups, polling only", "err", err, "poll_interval", r.cfg.PollInterval)
			return
		case attempt == 0:
			// The database may be restarting: listen again later (the
			// relay polls meanwhile) rather than poll for good.
			r.cfg.Logger.Warn("outbox: no wake-ups yet, polling until the listener starts", "err", err, "poll_interval", r.cfg.PollInterval)
		case attempt%10 == 0:
			r.cfg.Logger.Warn("outbox: wake-up listener still not started, polling", "err", err, "attempts", attempt+1)
		}
	}
	if attempt > 0 {
		r.cfg.Logger.Info("outbox: wake-up listener started")
	}
	signal()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w:
			signal()
		}
	}
}

// loop is one worker of Run: rounds until ctx is done.
func (r *Relay[TTx]) loop(ctx context.Context, wakeUp <-chan struct{}) {
	var (
		// Consecutive failed rounds: in the database, and rounds whose
		// every event the publisher failed or skipped.
		storageFailures, publishFailures int
		nextRetry                        time.Time // earliest retry of an event backed off by this loop
	)
	for {
		start := r.cfg.Now()
		res, err := r.round(ctx)
		if ctx.Err() != nil {
			return
		}
		r.reportLag(ctx, false)
		if !nextRetry.IsZero() && !nextRetry.After(start) {
			nextRetry = time.Time{}
		}
		if !res.retryAt.IsZero() && (nextRetry.IsZero() || res.retryAt.Before(nextRetry)) {
			nextRetry = res.retryAt
		}

		if err == nil || res.publishFailed {
			// The database answered (publish failures are marked).
			r.logStorageRecovered()
			storageFailures = 0
		}
		// A round that published events despite a publish failure shows
		// the broker up: its failed events wait for their own retry
		// (nextRetry), and backing off the whole relay would hold up the
		// keys that did not fail.
		if err != nil && (!res.publishFailed || res.published == 0) {
			// The database's failures and the publisher's are counted
			// apart: the first round the publisher skips or fails after
			// an outage (a broker client reconnecting, idemd's embedded
			// broker waiting for its lease's renewal on that database)
			// backs off as a first failure, not as the outage's n-th
			// (Backoff's minute).
			failures := &publishFailures
			if !res.publishFailed {
				failures = &storageFailures
			} else {
				r.publishOutage.Store(true)
			}
			*failures++
			wait := max(r.cfg.Backoff(*failures), minBackoff)
			var wake <-chan struct{}
			if res.publishFailed {
				// Not woken by enqueues (every one would fail), but
				// within seconds of the broker's return; yet claiming at
				// most about a tenth of the time (a claim over a backlog
				// of millions whose keys all back off takes seconds).
				wait = min(wait, max(PublishBackoffCeiling, claimShare*res.claimTook))
			} else { // publish failures were logged with their event
				// The database failed, not the broker: retry at least
				// every StorageBackoffCeiling, and at once when a wake-up
				// says a transaction committed (it is back).
				wait = min(wait, StorageBackoffCeiling)
				wake = wakeUp
				if start.UnixNano() >= r.storageBackAt.Load() {
					r.logStorageFailure(err, storageFailures, wait)
				}
			}
			if !backoff.Sleep(ctx, max(backoff.Jitter(wait), minBackoff), wake) {
				return
			}
			continue
		}
		storageFailures, publishFailures = 0, 0
		if res.published > 0 && r.publishOutage.Load() && r.publishOutage.CompareAndSwap(true, false) {
			// The broker is back: the events that failed during its
			// outage need not wait out the backoff their attempts
			// reached (up to Backoff's longest).
			if r.retryBackedOff(ctx) > 0 {
				continue
			}
		}
		if res.claimed > 0 {
			// A claim may stop short of BatchSize with events left (it
			// spreads the batch over the lanes it holds): go on until a
			// round finds nothing.
			continue
		}
		wait := r.cfg.PollInterval
		if !nextRetry.IsZero() {
			wait = min(wait, max(nextRetry.Sub(r.cfg.Now()), 0))
		}
		if !backoff.Sleep(ctx, wait, wakeUp) {
			return
		}
	}
}

// retryBackedOff makes every event backing off due now, after a publish
// outage, and returns how many it changed. A failure is logged and given
// up: those events wait for their own retry, as before the outage ended.
func (r *Relay[TTx]) retryBackedOff(ctx context.Context) int {
	qctx, cancel := context.WithTimeout(ctx, retryNowTimeout)
	defer cancel()
	total := 0
	for {
		n, err := r.drv.Outbox().OutboxRetryNow(qctx, &driver.OutboxRetryNowParams{At: r.cfg.Now(), Limit: retryNowBatch})
		total += n
		if err != nil {
			if ctx.Err() == nil {
				r.cfg.Logger.WarnContext(ctx, "outbox: the publisher is back, but the events that failed during its outage could not be made due now; they are retried after their backoff",
					"err", err, "retried_now", total)
			}
			return total
		}
		if n < retryNowBatch {
			break
		}
	}
	if total > 0 {
		r.cfg.Logger.InfoContext(ctx, "outbox: the publisher is back; the events that failed during its outage are retried now", "events", total)
	}
	return total
}

// logStorageFailure logs a round of Run that failed in the database (the
// failures-th in a row of its worker, retried in wait) through r.storage:
// at once when its failure (grouped by error text, digits aside) is first
// seen, then at most every failureLogInterval with the rounds not logged.
// A database outage fails every round, one per StorageBackoffCeiling at
// most, of every worker.
func (r *Relay[TTx]) logStorageFailure(err error, failures int, wait time.Duration) {
	log, g := r.storage.failed(err.Error(), r.cfg.Now())
	switch {
	case !log:
	case g.rounds == 1:
		// A passing failure (a connection lost or refused, a restart, a
		// failover) usually ends within a round or two: a WARN, and an
		// ERROR only when it lasts (the summary below). Anything else
		// needs someone at once.
		level := slog.LevelError
		if dberr.Transient(err) {
			level = slog.LevelWarn
		}
		r.cfg.Logger.Log(context.Background(), level, "outbox: relay round failed", "err", err, "consecutive_failures", failures, "retry_in", wait)
	default:
		r.cfg.Logger.Error("outbox: relay rounds still failing; repeats of a failure are logged at most every "+failureLogInterval.String(),
			"err", err, "suppressed", g.suppressed, "failed_rounds", g.rounds, "ok_rounds", g.succeeded, "since", g.first,
			"consecutive_failures", failures, "retry_in", wait)
	}
}

// logStorageRecovered logs the end of the storage failures of Run's rounds,
// if any: a round went through the database flaplog.Quiet after the last
// failed one. The rounds that go through before are counted into the next
// summary (ok_rounds), so that rounds that alternate failing and going
// through (a database short of connections) are not two lines a flip.
func (r *Relay[TTx]) logStorageRecovered() {
	if r.storage.size.Load() == 0 {
		return
	}
	now := r.cfg.Now()
	if g, ok := r.storage.endedQuiet(now, flaplog.Quiet); ok {
		r.storageBackAt.Store(now.UnixNano())
		r.cfg.Logger.Info("outbox: relay rounds succeed again after failed rounds; none failed for "+flaplog.Quiet.String(),
			"failed_rounds", g.rounds, "ok_rounds", g.succeeded, "over", now.Sub(g.first), "since", g.first, "last_failure", g.last, "err", g.err)
	}
}

// RunOnce claims one batch, publishes it and marks it, and returns how many
// events it published. A non-nil error is either a publish failure (the
// events reported published are marked, each key's first failed event is
// backed off or parked, the rest will be claimed again) or a storage failure
// (nothing is marked: the whole batch will be claimed, and published, again).
// On SQLite it takes the relay lease (RelayLockName) for the round and
// returns 0 and ErrStandby while another relay holds it.
func (r *Relay[TTx]) RunOnce(ctx context.Context) (int, error) {
	var (
		res roundResult
		err error
	)
	if r.late != nil {
		if _, lerr := r.applyLate(ctx); lerr != nil {
			r.cfg.Logger.Warn("outbox: could not apply outcomes learned after publish gave up on them; their events are retried at their backoff",
				"err", lerr)
		}
	}
	if r.lease != nil {
		res, err = r.runOnceLeased(ctx)
	} else {
		res, err = r.round(ctx)
	}
	r.reportLag(ctx, true)
	return res.published, err
}

// lagEvery is how often Run reports the lag (a query per report).
const lagEvery = 250 * time.Millisecond

// lagTimeout bounds a lag query on a backend with concurrent writers
// (PostgreSQL), as claimTimeout bounds a claim.
const lagTimeout = 5 * time.Second

// keepReportingLag reports the lag every PollInterval (at least lagEvery)
// in which nothing else did, until ctx ends: the rounds report it as they
// end, and one stuck in Publish (a broker client keeping a record whose
// outcome it does not know, whatever the context says) or in the database
// would otherwise leave the lag gauge at its last value, however long the
// event has waited.
func (r *Relay[TTx]) keepReportingLag(ctx context.Context) {
	every := max(r.cfg.PollInterval, lagEvery)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if time.Now().UnixNano()-r.lagAt.Load() >= int64(every) {
			r.reportLag(ctx, false)
		}
	}
}

// reportLag calls OnLag with the age of the oldest unpublished event; at
// most every lagEvery unless always. A failed query is logged through
// r.lag: when the queries start failing, then at most every
// failureLogInterval (the queries that succeed in between counted), and
// once when one succeeds flaplog.Quiet after the last failed one.
func (r *Relay[TTx]) reportLag(ctx context.Context, always bool) {
	if r.cfg.OnLag == nil || ctx.Err() != nil {
		return
	}
	now := time.Now().UnixNano()
	last := r.lagAt.Load()
	if !always && (now-last < int64(lagEvery) || !r.lagAt.CompareAndSwap(last, now)) {
		return
	}
	r.lagAt.Store(now)
	qctx := ctx
	if r.locking {
		// Bounded as a claim is (a connection cut off without a reset).
		var cancel context.CancelFunc
		qctx, cancel = context.WithTimeout(ctx, lagTimeout)
		defer cancel()
	}
	oldest, ok, err := r.drv.Outbox().OutboxOldestUnpublished(qctx)
	if err != nil {
		log, g := r.lag.failed(err.Error(), r.cfg.Now())
		switch {
		case !log:
		case g.rounds == 1:
			r.cfg.Logger.Warn("outbox: lag unknown", "err", err)
		default:
			r.cfg.Logger.Warn("outbox: lag still unknown; repeats are logged at most every "+failureLogInterval.String(),
				"err", err, "suppressed", g.suppressed, "failed_queries", g.rounds, "ok_queries", g.succeeded, "since", g.first)
		}
		return
	}
	if r.lag.size.Load() != 0 {
		now := r.cfg.Now()
		if g, ok := r.lag.endedQuiet(now, flaplog.Quiet); ok {
			r.cfg.Logger.Info("outbox: lag known again after failed queries; none failed for "+flaplog.Quiet.String(),
				"failed_queries", g.rounds, "ok_queries", g.succeeded, "over", now.Sub(g.first), "since", g.first, "last_failure", g.last, "err", g.err)
		}
	}
	var lag time.Duration
	if ok {
		lag = max(r.cfg.Now().Sub(oldest), 0)
	}
	r.cfg.OnLag(lag)
}
