package idemotel_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	promclient "github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/observe"
)

func TestTracerAndPropagator(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr := idemotel.NewTracer(tp)
	prop := idemotel.Propagator(nil)

	ctx, producer := tr.Start(context.Background(), "producer", observe.String("s", "v"), observe.Int("n", 3), observe.Bool("b", true))
	headers := map[string]string{}
	prop.Inject(ctx, func(k, v string) { headers[k] = v })
	producer.End()
	tp0 := headers[observe.TraceParent]
	if observe.TraceID(tp0) == "" {
		t.Fatalf("Inject wrote %v; want a traceparent", headers)
	}

	remote := prop.Extract(context.Background(), func(k string) string { return headers[k] })
	_, consumer := tr.Start(remote, "consumer")
	consumer.AddLink(remote)
	consumer.AddLink(context.Background()) // no span: no link
	consumer.SetAttributes(observe.Int("applied", 1))
	consumer.RecordError(errors.New("boom"))
	consumer.End()

	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans", len(spans))
	}
	p, c := spans[0], spans[1]
	if c.Parent().SpanID() != p.SpanContext().SpanID() || c.SpanContext().TraceID() != p.SpanContext().TraceID() {
		t.Errorf("consumer span not a child of the producer's")
	}
	if len(c.Links()) != 1 || c.Links()[0].SpanContext.SpanID() != p.SpanContext().SpanID() {
		t.Errorf("consumer links %v", c.Links())
	}
	if c.Status().Code.String() != "Error" || len(p.Attributes()) != 3 || len(c.Attributes()) != 1 {
		t.Errorf("status %v, producer attributes %v, consumer attributes %v", c.Status(), p.Attributes(), c.Attributes())
	}
}

// observe.StartKind starts spans of OpenTelemetry's kind; Start's are
// internal.
func TestSpanKinds(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr := idemotel.NewTracer(tp)
	want := map[string]trace.SpanKind{
		"internal": trace.SpanKindInternal, "server": trace.SpanKindServer, "client": trace.SpanKindClient,
		"producer": trace.SpanKindProducer, "consumer": trace.SpanKindConsumer, "start": trace.SpanKindInternal,
	}
	for name, kind := range map[string]observe.Kind{"internal": observe.KindInternal, "server": observe.KindServer,
		"client": observe.KindClient, "producer": observe.KindProducer, "consumer": observe.KindConsumer} {
		_, s := observe.StartKind(context.Background(), tr, kind, name, observe.String("k", "v"))
		s.End()
	}
	_, s := tr.Start(context.Background(), "start")
	s.End()
	for _, sp := range rec.Ended() {
		if sp.SpanKind() != want[sp.Name()] {
			t.Errorf("span %s: kind %v, want %v", sp.Name(), sp.SpanKind(), want[sp.Name()])
		}
	}
	if n := len(rec.Ended()); n != len(want) {
		t.Errorf("%d spans, want %d", n, len(want))
	}
	if _, s := observe.StartKind(context.Background(), nil, observe.KindServer, "none"); s != observe.NoopSpan {
		t.Errorf("StartKind with a nil Tracer = %v, want NoopSpan", s)
	}
}

// idemd's Prometheus metrics go out through OpenTelemetry under the same
// names.
func TestPrometheusProducerKeepsNames(t *testing.T) {
	reg := promclient.NewRegistry()
	c := promclient.NewCounterVec(promclient.CounterOpts{Name: "idemd_http_outcomes_total", Help: "h"}, []string{"outcome"})
	g := promclient.NewGauge(promclient.GaugeOpts{Name: "idemd_outbox_lag_seconds", Help: "h"})
	reg.MustRegister(c, g)
	c.WithLabelValues("executed").Add(2)
	g.Set(1.5)

	reader := sdkmetric.NewManualReader(sdkmetric.WithProducer(idemotel.PrometheusProducer(reg)))
	_ = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			names[m.Name] = true
		}
	}
	for _, want := range []string{"idemd_http_outcomes_total", "idemd_outbox_lag_seconds"} {
		if !names[want] {
			t.Errorf("metric %s not exported; got %v", want, names)
		}
	}
}

func TestEnabledAndSetup(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	if idemotel.Enabled(false, env(nil)) || !idemotel.Enabled(true, env(nil)) ||
		!idemotel.Enabled(false, env(map[string]string{idemotel.EnvEndpoint: "http://127.0.0.1:1"})) {
		t.Error("Enabled: wrong answer")
	}
	t.Cleanup(func() { observe.SetDefault(nil, nil) })
	// A closed port: Setup connects to nothing, so it succeeds at once.
	tel, err := idemotel.Setup(context.Background(), idemotel.Config{ServiceName: "test",
		Getenv: env(map[string]string{idemotel.EnvEndpoint: "http://127.0.0.1:1"}), Gatherer: promclient.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	if tel.Tracer == nil || observe.DefaultTracer() == nil || observe.DefaultPropagator() == nil || tel.MeterProvider == nil {
		t.Fatalf("Setup: %+v; defaults not installed", tel)
	}
	_, s := tel.Tracer.Start(context.Background(), "x")
	s.End()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := tel.Shutdown(ctx); err != nil && !strings.Contains(err.Error(), "127.0.0.1:1") && !errors.Is(err, context.DeadlineExceeded) {
		t.Logf("Shutdown without a collector: %v", err)
	}
}

// An OTLP endpoint that is not an http(s) URL with a host (a scheme
// forgotten, a typo) is a configuration mistake: the exporter would ignore
// it and export to localhost:4318, or send every batch nowhere. Setup
// rejects it, naming the variable, and installs nothing.
func TestSetupRejectsMalformedEndpoint(t *testing.T) {
	t.Cleanup(func() { observe.SetDefault(nil, nil) })
	observe.SetDefault(nil, nil)
	for _, tc := range []struct {
		env      map[string]string
		gatherer bool
		name     string
	}{
		{map[string]string{idemotel.EnvEndpoint: "collector:4318"}, false, idemotel.EnvEndpoint},
		{map[string]string{idemotel.EnvEndpoint: "localhost:4318"}, false, idemotel.EnvEndpoint},
		{map[string]string{idemotel.EnvTracesEndpoint: "http://[::1"}, false, idemotel.EnvTracesEndpoint},
		{map[string]string{idemotel.EnvTracesEndpoint: "ftp://collector:4318/v1/traces"}, false, idemotel.EnvTracesEndpoint},
		{map[string]string{idemotel.EnvTracesEndpoint: "http:///v1/traces"}, false, idemotel.EnvTracesEndpoint},
		{map[string]string{idemotel.EnvEndpoint: "http://127.0.0.1:1", idemotel.EnvMetricsEndpoint: "collector:4318/v1/metrics"}, true, idemotel.EnvMetricsEndpoint},
	} {
		var g promclient.Gatherer
		if tc.gatherer {
			g = promclient.NewRegistry()
		}
		tel, err := idemotel.Setup(context.Background(), idemotel.Config{Getenv: func(k string) string { return tc.env[k] }, Gatherer: g})
		if err == nil {
			_ = tel.Shutdown(context.Background())
			t.Errorf("Setup(%v): no error", tc.env)
			continue
		}
		if !strings.Contains(err.Error(), tc.name) {
			t.Errorf("Setup(%v): %v; want the variable %s named", tc.env, err, tc.name)
		}
		if observe.DefaultTracer() != nil {
			t.Errorf("Setup(%v) failed but installed observe's default Tracer", tc.env)
			observe.SetDefault(nil, nil)
		}
	}
	// What the exporters accept goes through: a host with a port, a path.
	tel, err := idemotel.Setup(context.Background(), idemotel.Config{Getenv: func(k string) string {
		return map[string]string{idemotel.EnvEndpoint: "https://collector.example:4318/otlp/"}[k]
	}})
	if err != nil {
		t.Fatalf("valid endpoint: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = tel.Shutdown(ctx)
}

// An endpoint with credentials in its userinfo that does not parse (a
// port mistyped) fails Setup with an error that names the variable but not
// the password: idemd logs that error.
func TestSetupMalformedEndpointErrorHidesPassword(t *testing.T) {
	t.Cleanup(func() { observe.SetDefault(nil, nil) })
	for _, v := range []string{
		"http://otel:s3cret@collector:port",
		"http://otel:s3cret@collector:4318/%zz",
		"http://otel:s3cret@[::1:4318",
	} {
		tel, err := idemotel.Setup(context.Background(), idemotel.Config{Getenv: func(k string) string {
			return map[string]string{idemotel.EnvEndpoint: v}[k]
		}})
		if err == nil {
			_ = tel.Shutdown(context.Background())
			t.Errorf("Setup(%s=%q): no error", idemotel.EnvEndpoint, v)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), idemotel.EnvEndpoint) {
			t.Errorf("Setup(%s=%q) = %q; want the variable named and the password not shown", idemotel.EnvEndpoint, v, err)
		}
	}
}

// observe.Span.RecordError with a nil error, as OpenTelemetry's own
// RecordError allows, records nothing and does not panic.
func TestRecordErrorNil(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tr := idemotel.NewTracer(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	_, s := tr.Start(context.Background(), "x")
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Errorf("RecordError(nil) panicked: %v", p)
			}
		}()
		s.RecordError(nil)
	}()
	s.End()
	if spans := rec.Ended(); len(spans) != 1 || spans[0].Status().Code.String() == "Error" || len(spans[0].Events()) != 0 {
		t.Errorf("span after RecordError(nil): %+v", spans)
	}
}

// The service name follows OpenTelemetry's precedence: OTEL_SERVICE_NAME,
// then service.name in OTEL_RESOURCE_ATTRIBUTES, then Config.ServiceName.
// A deployment that names its service in OTEL_RESOURCE_ATTRIBUTES must not
// see its spans exported under the program's built-in name.
func TestSetupServiceName(t *testing.T) {
	t.Cleanup(func() { observe.SetDefault(nil, nil) })
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{nil, "idemd"},
		{map[string]string{idemotel.EnvServiceName: "payments"}, "payments"},
		{map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod, service.name = orders%2Dapi "}, "orders-api"},
		{map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "service.name=orders", idemotel.EnvServiceName: "payments"}, "payments"},
		{map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "service.namespace=shop"}, "idemd"},
	} {
		env := map[string]string{idemotel.EnvEndpoint: "http://127.0.0.1:1"}
		for k, v := range tc.env {
			env[k] = v
		}
		tel, err := idemotel.Setup(context.Background(), idemotel.Config{ServiceName: "idemd", Getenv: func(k string) string { return env[k] }})
		if err != nil {
			t.Fatal(err)
		}
		sr := tracetest.NewSpanRecorder()
		tel.TracerProvider.RegisterSpanProcessor(sr)
		_, s := tel.Tracer.Start(context.Background(), "x")
		s.End()
		var got string
		for _, kv := range sr.Ended()[0].Resource().Attributes() {
			if kv.Key == "service.name" {
				got = kv.Value.AsString()
			}
		}
		if got != tc.want {
			t.Errorf("env %v: service.name %q, want %q", tc.env, got, tc.want)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_ = tel.Shutdown(ctx)
		cancel()
	}
}

// A batch whose first traceparent TraceID accepts but the propagator
// refuses (version 00 with flag bits OpenTelemetry rejects) still continues
// the trace of the events the propagator reads: the refused one is no
// trace context, not a reason to start a new trace.
func TestStartBatchSkipsTraceContextThePropagatorRefuses(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tr := idemotel.NewTracer(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	const trace = "4bf92f3577b34da6a3ce929d0e0e4736"
	refused := "00-" + trace + "-00f067aa0ba902b7-ff"
	good := "00-" + trace + "-00f067aa0ba902b8-01"
	if observe.TraceID(refused) == "" {
		t.Fatalf("TraceID(%q) is empty; the test needs one TraceID accepts", refused)
	}
	hs := []string{refused, good}
	_, s := observe.StartBatch(context.Background(), tr, observe.KindConsumer, idemotel.Propagator(nil), "batch", len(hs),
		func(i int, k string) string {
			if k == observe.TraceParent {
				return hs[i]
			}
			return ""
		})
	s.End()
	b := rec.Ended()[0]
	if got := b.SpanContext().TraceID().String(); got != trace || b.Parent().SpanID().String() != "00f067aa0ba902b8" {
		t.Errorf("batch span in trace %s, parent %s; want a child of 00f067aa0ba902b8 in %s", got, b.Parent().SpanID(), trace)
	}
	if len(b.Links()) != 1 {
		t.Errorf("batch links %v; want the readable event's alone", b.Links())
	}
}

// When the metric exporter cannot be built (here: a CA certificate for the
// metrics, from the process environment, with an http:// endpoint), Setup
// fails and leaves every global as it was: the tracer provider it had
// built is shut down, and must not stay OpenTelemetry's or observe's
// default, where later spans would be dropped.
func TestSetupFailureLeavesGlobals(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE", writeCert(t))
	rec := tracetest.NewSpanRecorder()
	prevTP := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = prevTP.Shutdown(context.Background()) })
	prevMP := sdkmetric.NewMeterProvider()
	prevProp := propagation.Baggage{}
	var handled []error
	otel.SetTracerProvider(prevTP)
	otel.SetMeterProvider(prevMP)
	otel.SetTextMapPropagator(prevProp)
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { handled = append(handled, err) }))
	idemotel.Install(prevTP, prevProp)
	t.Cleanup(func() { observe.SetDefault(nil, nil) })

	tel, err := idemotel.Setup(context.Background(), idemotel.Config{Gatherer: promclient.NewRegistry(),
		Getenv: func(k string) string { return map[string]string{idemotel.EnvEndpoint: "http://127.0.0.1:1"}[k] }})
	if err == nil {
		_ = tel.Shutdown(context.Background())
		t.Fatal("Setup: no error")
	}
	if !strings.Contains(err.Error(), "metric exporter") {
		t.Fatalf("Setup: %v; want the metric exporter's error", err)
	}

	_, s := observe.DefaultTracer().Start(context.Background(), "observe")
	s.End()
	_, ots := otel.Tracer("test").Start(context.Background(), "otel")
	ots.End()
	if got := len(rec.Ended()); got != 2 {
		t.Errorf("after a failed Setup, %d of 2 spans reached the previous tracer provider", got)
	}
	if otel.GetMeterProvider() != prevMP {
		t.Error("after a failed Setup, the global meter provider changed")
	}
	if otel.GetTextMapPropagator() != prevProp || observe.DefaultPropagator() != idemotel.Propagator(prevProp) {
		t.Error("after a failed Setup, the global propagator changed")
	}
	otel.Handle(errors.New("probe"))
	if len(handled) != 1 {
		t.Errorf("after a failed Setup, the previous error handler got %v", handled)
	}
}

// writeCert writes a self-signed certificate, PEM-encoded, to a file and
// returns its path.
func writeCert(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "collector"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// OTEL_EXPORTER_OTLP_PROTOCOL (or the signal's own) set to grpc, as an
// OpenTelemetry operator or a collector's gRPC port (4317) suggests, is
// refused by name: the OTLP/HTTP exporters read it, warn at a level
// nobody sees and send OTLP/HTTP all the same, so every batch failed
// against a gRPC receiver. The HTTP encodings are accepted.
func TestSetupRejectsGRPCProtocol(t *testing.T) {
	t.Cleanup(func() { observe.SetDefault(nil, nil) })
	observe.SetDefault(nil, nil)
	for _, tc := range []struct {
		env      map[string]string
		gatherer bool
		name     string
	}{
		{map[string]string{idemotel.EnvProtocol: "grpc"}, false, idemotel.EnvProtocol},
		{map[string]string{idemotel.EnvTracesProtocol: "grpc"}, false, idemotel.EnvTracesProtocol},
		{map[string]string{idemotel.EnvProtocol: "http/protobuf", idemotel.EnvTracesProtocol: "grpc"}, false, idemotel.EnvTracesProtocol},
		{map[string]string{idemotel.EnvMetricsProtocol: "grpc"}, true, idemotel.EnvMetricsProtocol},
		{map[string]string{idemotel.EnvProtocol: "http"}, false, idemotel.EnvProtocol},
	} {
		tc.env[idemotel.EnvEndpoint] = "http://127.0.0.1:1"
		var g promclient.Gatherer
		if tc.gatherer {
			g = promclient.NewRegistry()
		}
		tel, err := idemotel.Setup(context.Background(), idemotel.Config{Getenv: func(k string) string { return tc.env[k] }, Gatherer: g})
		if err == nil {
			_ = tel.Shutdown(context.Background())
			t.Errorf("Setup(%v): no error", tc.env)
			continue
		}
		if !strings.Contains(err.Error(), tc.name) || !strings.Contains(err.Error(), "4318") {
			t.Errorf("Setup(%v): %v; want the variable %s named, and the OTLP/HTTP port", tc.env, err, tc.name)
		}
		if observe.DefaultTracer() != nil {
			t.Errorf("Setup(%v) failed but installed observe's default Tracer", tc.env)
			observe.SetDefault(nil, nil)
		}
	}
	for _, env := range []map[string]string{
		{idemotel.EnvProtocol: "http/protobuf"},
		{idemotel.EnvProtocol: "http/json"},
		{idemotel.EnvProtocol: "grpc", idemotel.EnvTracesProtocol: "http/protobuf"}, // no metrics exporter
	} {
		env[idemotel.EnvEndpoint] = "http://127.0.0.1:1"
		tel, err := idemotel.Setup(context.Background(), idemotel.Config{Getenv: func(k string) string { return env[k] }})
		if err != nil {
			t.Errorf("Setup(%v): %v", env, err)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_ = tel.Shutdown(ctx)
		cancel()
	}
}
