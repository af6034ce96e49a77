package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"time"
)

// startTimeout bounds connecting to (an unreachable database is retried
// until then) and migrating the database, and reaching Kafka.
const startTimeout = 30 * time.Second

// Run is idemd: it parses args and the environment, opens the database,
// prints one line saying where it listens, serves until ctx is done (the
// signal), drains and closes. It returns the process exit code.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	return RunWith(ctx, args, getenv, stdout, stderr, Options{})
}

// RunWith is Run with what the program plugs in (opts): cmd/idemd passes
// the OpenTelemetry exporter there.
func RunWith(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, opts Options) int {
	// envErr is reported by every command once it is not asked for -h,
	// before its other configuration mistakes (which a typo may cause).
	var envErr error
	if opts.Environ != nil {
		envErr = checkEnv(opts.Environ())
	}
	if len(args) > 0 && args[0] == "outbox" {
		return runOutbox(ctx, args[1:], getenv, envErr, stdout, stderr)
	}
	if len(args) > 0 && args[0] == "migrate" {
		return runMigrate(ctx, args[1:], getenv, envErr, stdout, stderr)
	}
	if len(args) > 0 && args[0] == "demo" {
		return runDemo(ctx, args[1:], getenv, envErr, stdout, stderr)
	}
	cfg, err := ParseConfig(args, getenv)
	if errors.Is(err, flag.ErrHelp) {
		_, _ = fmt.Fprint(stdout, Usage())
		return 0
	}
	if envErr != nil {
		err = envErr
	}
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "idemd: %s\n", errMessage(err))
		return 2
	}
	log := newLogger(cfg.LogFormat, stderr)

	// Listen first: a port in use fails before anything starts.
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "idemd: %s\n", errMessage(err))
		return 1
	}
	var adminLn net.Listener
	if cfg.AdminAddr != "" {
		if adminLn, err = net.Listen("tcp", cfg.AdminAddr); err != nil {
			_ = ln.Close()
			_, _ = fmt.Fprintf(stderr, "idemd: -admin-addr %s: %s\n", cfg.AdminAddr, errMessage(err))
			return 1
		}
	}
	closeListeners := func() {
		_ = ln.Close()
		if adminLn != nil {
			_ = adminLn.Close()
		}
	}
	bound := startTimeout
	if opts.startTimeout > 0 {
		bound = opts.startTimeout
	}
	sctx, cancel := context.WithTimeout(ctx, bound)
	metrics := &lazyGatherer{}
	tel := startTelemetry(sctx, cfg, opts, getenv, log, metrics)
	// The last flush counts in -shutdown-timeout, from the moment ctx ends
	// (or Serve returns, on a failure).
	var stopping atomic.Pointer[time.Time]
	stopAt := func() {
		now := time.Now()
		stopping.CompareAndSwap(nil, &now)
	}
	unregister := context.AfterFunc(ctx, stopAt)
	defer func() {
		unregister()
		stopAt()
		stopTelemetry(tel, log, stopping.Load().Add(cfg.ShutdownTimeout))
	}()
	a, err := New(sctx, cfg, log, WithTelemetry(tel))
	cancel()
	if a != nil {
		metrics.set(a.metrics.reg)
	}
	if err != nil && ctx.Err() != nil {
		// The signal, not the database or Kafka, ended the start: what
		// New was waiting for failed with "context canceled". Nothing
		// was served and nothing is left half done (each migration runs
		// in a transaction), so this is the stop that was asked for.
		closeListeners()
		_, _ = fmt.Fprintln(stderr, "idemd: stopped during start-up by a signal, before serving")
		return 0
	}
	if err != nil {
		closeListeners()
		_, _ = fmt.Fprintf(stderr, "idemd: %s\n", errMessage(err))
		var ce *ConfigError
		if errors.As(err, &ce) {
			return 2
		}
		return 1
	}
	adminLine := ""
	if adminLn != nil {
		adminLine = fmt.Sprintf("; admin endpoints (/metrics, /healthz, /livez) on http://%s", adminLn.Addr())
	}
	_, _ = fmt.Fprintf(stdout, "idemd listening on http://%s with database %s and kafka %s%s\n", ln.Addr(), cfg.DB, a.Kafka(), adminLine)
	err = a.ServeWithAdmin(ctx, ln, adminLn)
	stopAt()
	closed := closeWithin(a, stopping.Load().Add(cfg.ShutdownTimeout))
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "idemd: %s\n", errMessage(err))
		return 1
	}
	if !closed {
		log.Error("shutdown: closing the Kafka client, embedded broker and database did not finish within -shutdown-timeout (a worker is stuck on an unanswering database); exiting without waiting",
			"shutdown_timeout", cfg.ShutdownTimeout)
		return 1
	}
	log.Info("shutdown: Kafka client, embedded broker and database closed")
	return 0
}

// closeWithin closes a and reports whether that ended by deadline (at least
// closeFloor from now). A worker stuck on a database that stopped answering
// (a network partition: no error, no reset) holds its connection, and
// closing the pool waits for it until the kernel gives up on the socket,
// minutes later: idemd then exits without waiting, which closes the
// sockets. Nothing is lost: the stuck transaction never committed, and the
// embedded broker's log survives an exit at any point, as it survives a
// SIGKILL.
func closeWithin(a *App, deadline time.Time) bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.Close()
	}()
	t := time.NewTimer(max(time.Until(deadline), closeFloor))
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// closeFloor is the least time closeWithin gives Close, when Serve used
// the whole -shutdown-timeout.
const closeFloor = 200 * time.Millisecond

func newLogger(format string, w io.Writer) *slog.Logger {
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, nil))
	}
	return slog.New(slog.NewJSONHandler(w, nil))
}
