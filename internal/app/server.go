package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Serve serves on ln until ctx is done, then shuts down gracefully: it stops
// accepting, waits up to Config.ShutdownTimeout for in-flight requests, and
// returns. It also runs the retention sweep on Config.Cleanup's schedule.
// It does not close the database (Close does).
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
	if a.sweep != nil {
		// Stops with ctx; a sweep in progress stops within one statement.
		swept := make(chan struct{})
		defer func() { <-swept }()
		go func() {
			defer close(swept)
			if err := a.sweep(ctx); err != nil {
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
	a.log.Info("stopped")
	return nil
}
