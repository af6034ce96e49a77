package main_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/internal/app"
)

// BenchmarkRequestTelemetry measures what -otel costs a request in idemd's
// handler: GET /livez, which does nothing else, so that the difference
// between the sub-benchmarks is the server span, the log line's trace IDs
// and their allocations. "off" is idemd without telemetry; "on" samples
// every span and exports them (to nowhere) through a batch processor, as
// idemd's exporter does; "on-traceparent" continues a caller's trace.
//
//	go test -run '^$' -bench RequestTelemetry -benchtime 20000x -count 1 ./cmd/idemd/
func BenchmarkRequestTelemetry(b *testing.B) {
	for _, c := range []struct {
		name        string
		otel        bool
		traceparent string
	}{
		{"off", false, ""},
		{"on", true, ""},
		{"on-traceparent", true, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	} {
		b.Run(c.name, func(b *testing.B) {
			var opts []app.Option
			if c.otel {
				tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()),
					sdktrace.WithBatcher(tracetest.NewNoopExporter()))
				b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
				opts = append(opts, app.WithTelemetry(&app.Telemetry{Tracer: idemotel.NewTracer(tp), Propagator: idemotel.Propagator(nil)}))
			}
			cfg, err := app.ParseConfig([]string{"-db", "sqlite:" + filepath.Join(b.TempDir(), "idemd.db"), "-kafka", "off", "-cleanup", "off"},
				func(string) string { return "" })
			if err != nil {
				b.Fatal(err)
			}
			a, err := app.New(b.Context(), cfg, slog.New(slog.NewJSONHandler(io.Discard, nil)), opts...)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(a.Close)
			h := a.Handler()
			req := httptest.NewRequest(http.MethodGet, "/livez", nil)
			if c.traceparent != "" {
				req.Header.Set("traceparent", c.traceparent)
			}
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					b.Fatalf("GET /livez: %d", w.Code)
				}
			}
		})
	}
}
