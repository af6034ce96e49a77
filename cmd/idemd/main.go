package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	// The zone database in the binary: in an image without one (scratch,
	// some distroless ones) TZ=Europe/Berlin, or a -cleanup CRON_TZ=,
	// would otherwise fall back to UTC (TZ, silently) or fail at start-up.
	_ "time/tzdata"

	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/internal/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal terminates at once
	}()
	os.Exit(app.RunWith(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr, app.Options{Telemetry: telemetry, Environ: os.Environ}))
}

// telemetry is app.Options.Telemetry: OpenTelemetry over OTLP/HTTP
// (-otel, or OTEL_EXPORTER_OTLP_ENDPOINT set), idemd's Prometheus metrics
// exported under the same names.
func telemetry(ctx context.Context, s app.TelemetrySetup) (*app.Telemetry, error) {
	t, err := idemotel.Setup(ctx, idemotel.Config{ServiceName: "idemd", Getenv: s.Getenv, Gatherer: s.Gatherer, Logger: s.Logger})
	if err != nil {
		return nil, err
	}
	return &app.Telemetry{Tracer: t.Tracer, Propagator: t.Propagator, Shutdown: t.Shutdown}, nil
}
