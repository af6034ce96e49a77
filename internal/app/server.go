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

// Serve serves on ln until ctx is done, then shuts down gracefully: it stops
// accepting, waits up to Config.ShutdownTimeout for in-flight requests,
// then stops the outbox relay, the projection's consumer and the order
// saga's consumer (which finish their batch in flight and commit their
// offsets), and returns. It
// also runs the retention sweep on Config.Cleanup's schedule. It does not
// close the database or the embedded broker (Close does, afterwards).
func (a *App) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           a.handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	stopWorkers := a.startWorkers(ctx)
	defer stopWorkers()
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
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	a.log.Info("shutting down", "timeout", a.cfg.ShutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.ShutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if err != nil {
		_ = srv.Close()
		return fmt.Errorf("shutdown: in-flight requests did not finish within %s: %w", a.cfg.ShutdownTimeout, err)
	}
	stopWorkers()
	a.log.Info("stopped")
	return nil
}

// startWorkers runs the outbox relay, the projection's consumer and the
// order saga's consumer (with its compensator), if any, until the returned function is called; it waits for them to stop.
// Their context is not ctx: they must outlive the HTTP drain (a request
// in flight may still enqueue an event).
func (a *App) startWorkers(ctx context.Context) (stop func()) {
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	for _, w := range []struct {
		name string
		run  func(context.Context) error
	}{{"outbox relay", a.relay}, {"order projection consumer", a.consume}, {"order saga consumer", a.saga}} {
		if w.run == nil {
			continue
		}
		a.log.Info(w.name+" started", a.started...)
		wg.Go(func() {
			if err := w.run(wctx); err != nil && wctx.Err() == nil {
				a.log.Error(w.name+" stopped", "err", err)
			}
		})
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			wg.Wait()
		})
	}
}
