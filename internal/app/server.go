package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// Serve serves on ln until ctx is done, then shuts down in this order,
// logging each step, all within Config.ShutdownTimeout:
//
//  1. stop accepting connections and wait for the requests in flight, for
//     two thirds of the bound at most (then their connections are closed
//     and Serve returns an error after the other steps);
//  2. stop the outbox relay and the consumers (the projection, the order
//     saga and its compensator, the stuck-order watchdog) together: the
//     relay's round in flight ends, each consumer finishes its batch in
//     flight and commits its offsets;
//  3. publish what is left in the outbox (the events of the requests just
//     finished and of the consumers' last batches), so nothing waits for
//     the next start.
//
// The consumers stop before the flush: running, they would keep enqueuing
// (the saga's PaymentCaptured.v1 for each OrderCreated.v1 the flush
// publishes, then OrderConfirmed.v1), and the flush, which ends once the
// outbox is empty, would work off their whole backlog.
//
// It also runs the retention sweep on Config.Cleanup's schedule. It does
// not close the database or the embedded broker: Close does, afterwards.
// An event left unpublished by a timeout is not lost: it stays in the
// outbox for the next start. A fatal failure (a worker that stopped with
// an error, the embedded broker's lease taken) starts the same shutdown;
// one reported while the shutdown runs is returned too, and a lease taken
// then stops the flushes at once.
func (a *App) Serve(ctx context.Context, ln net.Listener) error {
	return a.ServeWithAdmin(ctx, ln, nil)
}

// ServeWithAdmin is Serve with a second listener, admin, for Prometheus
// and the probes (Config.AdminAddr): it serves /metrics, /healthz and
// /livez, and ln every route but /metrics. A nil admin is Serve: every
// route on ln. Both listeners stop accepting together, at the first step
// of the shutdown; one that fails stops the other and the process, as a
// failing ln alone does.
func (a *App) ServeWithAdmin(ctx context.Context, ln, admin net.Listener) error {
	servers := []*httpServer{a.newServer("", ln, a.handler)}
	if admin != nil {
		servers = []*httpServer{a.newServer("", ln, a.apiHandler), a.newServer("admin ", admin, a.adminHandler)}
	}
	stopped := make(chan *httpServer, len(servers)) // each one's Serve returned
	for _, s := range servers {
		go func() {
			s.err = s.srv.Serve(s.ln)
			close(s.done)
			stopped <- s
		}()
	}
	// The start-up lines, once nothing can fail any more (a refused start
	// prints one line: its error).
	a.log.Info("database ready", "database", a.cfg.DB.String(), "driver", a.driverName)
	if a.sweep != nil {
		a.log.Info("retention sweep scheduled", "schedule", a.cfg.Cleanup)
	}
	started := []any{"addr", ln.Addr().String()}
	if admin != nil {
		started = append(started, "admin_addr", admin.Addr().String())
	}
	a.log.Info("http server started", append(started, "metrics", "/metrics", "health", "/healthz")...)
	// Their context is not ctx: they must outlive the HTTP drain (a
	// request in flight may still enqueue an event).
	relay := a.startWorkers(ctx, worker{"outbox relay", a.relay,
		append(a.started, "headers", a.cfg.KafkaHeaders.String())})
	consumerAttrs := []any{"topic", a.cfg.KafkaTopic}
	if a.cfg.KafkaInstanceID != "" {
		consumerAttrs = append(consumerAttrs, "instance_id", a.cfg.KafkaInstanceID)
	}
	consumers := a.startWorkers(ctx, worker{"order projection consumer", a.consume, consumerAttrs},
		worker{"order saga consumer", a.saga, consumerAttrs},
		worker{"stuck order watchdog", a.watchdog, []any{"stuck_after", a.cfg.SagaStuckAfter.String(), "give_up_after", a.cfg.SagaGiveUpAfter.String()}},
		worker{"consumer lag check", a.lagCheck, []any{"interval", kafkaLagInterval.String()}},
		a.parkedWorker())
	// deadline bounds the whole shutdown once it started.
	var deadline time.Time
	defer func() {
		// On every return, bounded: a worker that hangs (a broker or a
		// database that stopped answering) must not hold the process.
		if deadline.IsZero() {
			deadline = time.Now().Add(a.cfg.ShutdownTimeout)
		}
		dctx, cancel := context.WithDeadline(context.Background(), deadline)
		defer cancel()
		relay.stopWithin(dctx)
		consumers.stopWithin(dctx)
	}()
	if a.sweep != nil {
		// Stops with ctx, or when Serve returns (its server failed); a
		// sweep in progress stops within one statement.
		sctx, stopSweep := context.WithCancel(ctx)
		swept := make(chan struct{})
		defer func() { stopSweep(); <-swept }()
		go func() {
			defer close(swept)
			if err := a.sweep(sctx); err != nil {
				a.log.Error("retention sweep stopped", "err", err)
			}
		}()
	}
	var fatal error
	select {
	case s := <-stopped:
		// Not one listener without the other: the API without its
		// probes and metrics, or probes saying ready for an API that
		// no longer answers.
		for _, o := range servers {
			_ = o.srv.Close()
		}
		return fmt.Errorf("%sserve: %w", s.name, s.err)
	case <-ctx.Done():
	case fatal = <-a.fatal:
	}
	start := time.Now()
	deadline = start.Add(a.cfg.ShutdownTimeout)
	// failed handles a fatal failure, the first one or one reported
	// during the shutdown (checked before each step that publishes):
	// Serve returns the first.
	failed := func(err error) {
		if fatal == nil {
			fatal = err
		}
		a.log.Error("shutting down: this process cannot go on", "err", err)
		if errors.Is(err, errLeaseTaken) {
			// Not one more event into a log that is no longer the
			// database's: the relay stops now and nothing is flushed.
			a.flush = nil
			rctx, cancel := context.WithDeadline(context.Background(), deadline)
			relay.stopWithin(rctx)
			cancel()
		}
	}
	lateFailure := func() {
		select {
		case err := <-a.fatal:
			failed(err)
		default:
		}
	}
	if fatal != nil {
		err := fatal
		fatal = nil
		failed(err)
	}
	// Requests in flight get two thirds of the bound; the last third is
	// kept for the relay, the consumers and the outbox flush.
	drain := a.cfg.ShutdownTimeout * 2 / 3
	a.log.Info("shutdown: 1/3 stop accepting, waiting for requests in flight", "timeout", drain.String())
	sctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	hctx, hcancel := context.WithTimeout(sctx, drain)
	defer hcancel()
	err := shutdownServers(hctx, servers)
	if err != nil {
		// A client that does not finish its request (or a handler that
		// does not return) has had its share of the bound: its
		// connection is closed, and the steps below go on with the
		// rest. The exit is a failure.
		for _, s := range servers {
			_ = s.srv.Close()
		}
		err = fmt.Errorf("shutdown: in-flight requests did not finish within %s: %w", drain, err)
		a.log.Error("shutdown: requests in flight cut off", "err", err)
		if fatal == nil {
			fatal = err
		}
	}
	lateFailure()
	a.log.Info("shutdown: 2/3 requests done; stopping the relay and the consumers (each commits its batch in flight)", "elapsed", since(start))
	// Both stop at once; then each is waited for.
	relay.cancel()
	consumers.cancel()
	if !relay.stopWithin(sctx) {
		// Nothing is lost: a batch published but not marked is
		// published again at the next start (same event IDs).
		a.log.Warn("shutdown: the relay did not stop within the shutdown timeout; its batch in flight is published again at the next start", "elapsed", since(start))
	}
	if !consumers.stopWithin(sctx) {
		// Nothing is lost: offsets not committed are delivered again,
		// and the inboxes drop what was applied.
		a.log.Warn("shutdown: the consumers did not stop within the shutdown timeout; their batches in flight are delivered again", "elapsed", since(start))
	}
	a.log.Info("shutdown: 3/3 relay and consumers stopped; publishing what is left in the outbox", "elapsed", since(start))
	a.flushOutbox(sctx, lateFailure)
	lateFailure()
	a.log.Info("stopped", "elapsed", since(start))
	return fatal
}

// httpServer is one listener's server.
type httpServer struct {
	name string // "" or "admin ", for errors
	ln   net.Listener
	srv  *http.Server
	done chan struct{} // closed when Serve returned, with err
	err  error
}

func (a *App) newServer(name string, ln net.Listener, h http.Handler) *httpServer {
	return &httpServer{name: name, ln: ln, done: make(chan struct{}), srv: &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
	}}
}

// shutdownServers shuts servers down together (each stops accepting at
// once, then waits for its requests in flight until ctx ends) and returns
// the first failure.
func shutdownServers(ctx context.Context, servers []*httpServer) error {
	errs := make([]error, len(servers))
	var wg sync.WaitGroup
	for i, s := range servers {
		wg.Go(func() {
			err := s.srv.Shutdown(ctx)
			<-s.done
			if !errors.Is(s.err, http.ErrServerClosed) && err == nil {
				err = s.err
			}
			if err != nil && s.name != "" {
				err = fmt.Errorf("%sserver: %w", s.name, err)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func since(t time.Time) string { return time.Since(t).Round(time.Millisecond).String() }

// flushOutbox publishes the outbox until it is empty (for this relay: rows
// another replica's relay holds are its own), ctx ends, or a batch fails.
// check runs before each batch: a fatal failure it handles may end the
// flushing (a.flush set to nil).
func (a *App) flushOutbox(ctx context.Context, check func()) {
	if a.flush == nil {
		return
	}
	total := 0
	for ctx.Err() == nil {
		check()
		if a.flush == nil {
			if total > 0 {
				a.log.Warn("shutdown: outbox flush stopped by a failure; the rest is published at the next start", "published", total)
			}
			return
		}
		n, err := a.flush(ctx)
		total += n
		if err != nil {
			a.log.Warn("shutdown: outbox flush stopped; the rest is published at the next start", "published", total, "err", err)
			return
		}
		if n == 0 {
			break
		}
	}
	if ctx.Err() != nil {
		a.log.Warn("shutdown: timeout while flushing the outbox; the rest is published at the next start", "published", total)
		return
	}
	a.log.Info("shutdown: outbox flushed", "published", total)
}

// parkedWorker counts the parked events (its run is nil without a
// database).
func (a *App) parkedWorker() worker {
	if a.parked == nil {
		return worker{name: "outbox parked count"}
	}
	return worker{"outbox parked count", a.parked.run, []any{"interval", a.parked.interval.String()}}
}

// worker is a named background loop; run is nil when it is not configured.
type worker struct {
	name string
	run  func(context.Context) error
	// attrs are logged with its start: where it connects, what it uses.
	attrs []any
}

// workers runs a group of workers until stop.
type workers struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
	done   chan struct{} // closed when every worker returned
}

// startWorkers runs ws until the group's stopWithin is called.
func (a *App) startWorkers(ctx context.Context, ws ...worker) *workers {
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	g := &workers{cancel: cancel}
	for _, w := range ws {
		if w.run == nil {
			continue
		}
		a.log.Info(w.name+" started", w.attrs...)
		g.wg.Go(func() {
			if err := w.run(wctx); err != nil && wctx.Err() == nil {
				a.log.Error(w.name+" stopped", "err", err)
				a.fail(fmt.Errorf("%s stopped: %w", w.name, err))
			}
		})
	}
	return g
}

// stopWithin cancels the group and waits for its workers until ctx ends;
// it reports whether they stopped. It may be called again.
func (g *workers) stopWithin(ctx context.Context) bool {
	g.cancel()
	g.once.Do(func() {
		g.done = make(chan struct{})
		go func() { g.wg.Wait(); close(g.done) }()
	})
	select {
	case <-g.done:
		return true
	case <-ctx.Done():
		return false
	}
}
