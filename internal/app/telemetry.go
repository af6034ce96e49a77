package app

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/idemkit/idem/observe"
)

// Options are what the program running idemd plugs in: cmd/idemd fills
// Telemetry from the idemotel module, so that this package (and the core
// module) links no OpenTelemetry.
type Options struct {
	// Telemetry, if set, is called at start-up when Config.OTel is on. It
	// must not block on a collector: exporters connect lazily. An error
	// is logged and idemd runs without telemetry.
	Telemetry func(ctx context.Context, s TelemetrySetup) (*Telemetry, error)
	// Environ, if set, returns the environment as os.Environ does (the
	// one getenv reads): idemd and its subcommands then refuse to start
	// (exit 2) when it holds an IDEMD_ variable they do not read, a typo
	// that would leave a setting at its default. -h still answers.
	Environ func() []string
	// startTimeout replaces startTimeout when set (tests).
	startTimeout time.Duration
}

// TelemetrySetup is what Options.Telemetry gets.
type TelemetrySetup struct {
	// Gatherer reads idemd's Prometheus registry (the /metrics
	// collectors), to export the same metrics, under the same names,
	// through OpenTelemetry.
	Gatherer prometheus.Gatherer
	Getenv   func(string) string
	Logger   *slog.Logger
}

// Telemetry is the tracing that idemd's components use.
type Telemetry struct {
	// Tracer goes into the configs of the middleware, the inboxes, the
	// relay, the saga coordinator and the cleaner.
	Tracer observe.Tracer
	// Propagator continues the trace of an incoming request's
	// traceparent header (its server span is the caller's child), and
	// reads the trace_id and span_id of the log lines logged in a span's
	// context: with a Propagator that writes no traceparent, or none,
	// lines carry no IDs.
	Propagator observe.Propagator
	// Shutdown, if set, flushes the exporters at exit.
	Shutdown func(context.Context) error
}

// Option configures New.
type Option func(*App)

// WithTelemetry makes New trace with t (nil: nothing traced).
func WithTelemetry(t *Telemetry) Option {
	return func(a *App) {
		if t != nil {
			a.tracer, a.propagator = t.Tracer, t.Propagator
		}
	}
}

// telemetryShutdownTimeout bounds the exporters' last flush at exit.
const telemetryShutdownTimeout = 5 * time.Second

// lazyGatherer gathers the registry set later (the App's, built after the
// telemetry), nothing before.
type lazyGatherer struct {
	g atomic.Pointer[prometheus.Gatherer]
}

func (l *lazyGatherer) set(g prometheus.Gatherer) { l.g.Store(&g) }

func (l *lazyGatherer) Gather() ([]*dto.MetricFamily, error) {
	if g := l.g.Load(); g != nil {
		return (*g).Gather()
	}
	return nil, nil
}

// startTelemetry runs opts.Telemetry when cfg.OTel is on; nil otherwise or
// when it fails (logged).
func startTelemetry(ctx context.Context, cfg Config, opts Options, getenv func(string) string, log *slog.Logger, g prometheus.Gatherer) *Telemetry {
	if !cfg.OTel {
		return nil
	}
	if opts.Telemetry == nil {
		log.Warn("telemetry: -otel is on but this build of idemd has no OpenTelemetry exporter; running without")
		return nil
	}
	t, err := opts.Telemetry(ctx, TelemetrySetup{Gatherer: g, Getenv: getenv, Logger: log})
	if err != nil {
		log.Error("telemetry: not started; running without", "err", err)
		return nil
	}
	log.Info("telemetry: OpenTelemetry traces and metrics on", "endpoint", redactURL(getenv(EnvOTLPEndpoint)),
		"traces_endpoint", redactURL(getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")))
	return t
}

// stopTelemetry flushes t, within telemetryShutdownTimeout and before
// deadline (the end of -shutdown-timeout).
func stopTelemetry(t *Telemetry, log *slog.Logger, deadline time.Time) {
	if t == nil || t.Shutdown == nil {
		return
	}
	left := min(time.Until(deadline), telemetryShutdownTimeout)
	if left <= 0 {
		log.Warn("telemetry: last flush skipped: -shutdown-timeout is spent")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), left)
	defer cancel()
	if err := t.Shutdown(ctx); err != nil {
		log.Warn("telemetry: last flush failed", "err", err)
	}
}
