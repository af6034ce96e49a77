package idemotel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"

	promclient "github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/bridges/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemkit/idem/observe"
)

// Standard OpenTelemetry environment variables that Setup reads through
// Config.Getenv (the exporters read the others, such as
// OTEL_EXPORTER_OTLP_HEADERS, from the process environment).
const (
	EnvEndpoint        = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint  = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvMetricsEndpoint = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
	EnvServiceName     = "OTEL_SERVICE_NAME"
	// EnvResourceAttributes may name the service too (service.name=...),
	// below OTEL_SERVICE_NAME and above Config.ServiceName.
	EnvResourceAttributes = "OTEL_RESOURCE_ATTRIBUTES"
	// EnvProtocol and the signals' own variables choose the OTLP
	// transport: Setup's exporters speak OTLP/HTTP only, so grpc (or
	// anything but http/protobuf and http/json) fails Setup.
	EnvProtocol        = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol  = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	EnvMetricsProtocol = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"
)

// Enabled reports whether telemetry is on: flag (idemd's -otel) or a set
// OTEL_EXPORTER_OTLP_ENDPOINT (or its traces variant).
func Enabled(flag bool, getenv func(string) string) bool {
	return flag || getenv(EnvEndpoint) != "" || getenv(EnvTracesEndpoint) != ""
}

// Config configures Setup.
type Config struct {
	// ServiceName is the service.name resource attribute, unless
	// OTEL_SERVICE_NAME is set, or OTEL_RESOURCE_ATTRIBUTES holds a
	// service.name (OpenTelemetry's precedence). Defaults to "idem".
	ServiceName string
	// Getenv reads the environment. Defaults to no variable set.
	Getenv func(string) string
	// Gatherer, if set, is exported through OpenTelemetry metrics as well,
	// each metric under its Prometheus name (idemd's registry).
	Gatherer promclient.Gatherer
	// Logger receives the exporters' errors (a collector that is not
	// there). Defaults to slog.Default().
	Logger *slog.Logger
}

// Telemetry is what Setup built.
type Telemetry struct {
	// Tracer is the observe.Tracer to set in the components' configs; it
	// is also observe's default (Install).
	Tracer     observe.Tracer
	Propagator observe.Propagator
	// TracerProvider and MeterProvider are the SDK providers, also set as
	// OpenTelemetry's globals.
	TracerProvider *sdktrace.TracerProvider
	MeterProvider  *sdkmetric.MeterProvider
}

// Setup builds an OTLP/HTTP trace exporter and, with Config.Gatherer, an
// OTLP/HTTP metric exporter, on the endpoint of OTEL_EXPORTER_OTLP_ENDPOINT
// (or the signal's own variable; the OTLP default, localhost:4318,
// otherwise), installs them as OpenTelemetry's and observe's defaults
// (W3C trace context propagation) and returns them. Nothing connects here:
// the exporters connect when they first export, and a collector that is
// not there is logged, never fatal. An endpoint variable that is not an
// http:// or https:// URL with a host (collector:4318, a scheme forgotten)
// is an error: the exporter would ignore it or send every batch nowhere.
// So is an OTEL_EXPORTER_OTLP_PROTOCOL (or the signal's own) that is not
// http/protobuf or http/json: grpc would be sent OTLP/HTTP all the same.
// On any error nothing is installed: OpenTelemetry's and observe's globals
// (providers, propagator, error handler) stay as they were. Call Shutdown,
// with a deadline, at exit to flush.
func Setup(ctx context.Context, cfg Config) (*Telemetry, error) {
	getenv := cfg.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	if err := checkProtocol(getenv, EnvTracesProtocol); err != nil {
		return nil, err
	}
	traceURL, err := endpoint(getenv, EnvTracesEndpoint, "/v1/traces")
	if err != nil {
		return nil, err
	}
	var metricURL string
	if cfg.Gatherer != nil {
		if err := checkProtocol(getenv, EnvMetricsProtocol); err != nil {
			return nil, err
		}
		if metricURL, err = endpoint(getenv, EnvMetricsEndpoint, "/v1/metrics"); err != nil {
			return nil, err
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	name := cfg.ServiceName
	if name == "" {
		name = "idem"
	}
	if s := resourceServiceName(getenv(EnvResourceAttributes)); s != "" {
		name = s
	}
	if s := getenv(EnvServiceName); s != "" {
		name = s
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", name)}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attrs...))
	if err != nil {
		return nil, fmt.Errorf("idemotel: resource: %w", err)
	}
	var topts []otlptracehttp.Option
	if traceURL != "" {
		topts = append(topts, otlptracehttp.WithEndpointURL(traceURL))
	}
	texp, err := otlptracehttp.New(ctx, topts...)
	if err != nil {
		return nil, fmt.Errorf("idemotel: trace exporter: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(texp), sdktrace.WithResource(res))
	prop := propagation.TraceContext{}
	t := &Telemetry{TracerProvider: tp, Tracer: NewTracer(tp), Propagator: Propagator(prop)}

	if cfg.Gatherer != nil {
		var mopts []otlpmetrichttp.Option
		if metricURL != "" {
			mopts = append(mopts, otlpmetrichttp.WithEndpointURL(metricURL))
		}
		mexp, err := otlpmetrichttp.New(ctx, mopts...)
		if err != nil {
			_ = tp.Shutdown(ctx)
			return nil, fmt.Errorf("idemotel: metric exporter: %w", err)
		}
		t.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithResource(res),
			sdkmetric.WithReader(sdkmetric.NewPeriodicReader(mexp, sdkmetric.WithProducer(PrometheusProducer(cfg.Gatherer)))))
	}

	// The globals only once everything is built: a failure above leaves
	// the previous ones in place, not a provider already shut down.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("opentelemetry", "err", err) }))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(prop)
	observe.SetDefault(t.Tracer, t.Propagator)
	if t.MeterProvider != nil {
		otel.SetMeterProvider(t.MeterProvider)
	}
	return t, nil
}

// PrometheusProducer returns a metric producer that reads g: each
// Prometheus metric becomes an OpenTelemetry metric of the same name (the
// bridge of go.opentelemetry.io/contrib/bridges/prometheus).
func PrometheusProducer(g promclient.Gatherer) sdkmetric.Producer {
	return prometheus.NewMetricProducer(prometheus.WithGatherer(g))
}

// Shutdown flushes and stops the providers; ctx bounds it (an exporter
// whose collector is not there retries until ctx ends).
func (t *Telemetry) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	// Both at once: a collector that does not answer the traces' flush
	// must not leave the metrics' without time.
	var traceErr, meterErr error
	var wg sync.WaitGroup
	if t.TracerProvider != nil {
		wg.Go(func() { traceErr = t.TracerProvider.Shutdown(ctx) })
	}
	if t.MeterProvider != nil {
		wg.Go(func() { meterErr = t.MeterProvider.Shutdown(ctx) })
	}
	wg.Wait()
	return errors.Join(traceErr, meterErr)
}

// endpoint returns the URL of a signal's OTLP/HTTP endpoint from the
// environment: the signal's own variable as it is, or the generic one with
// the signal's path; "" when neither is set (the exporter's default). A
// value that is not an http or https URL with a host is an error naming
// the variable.
func endpoint(getenv func(string) string, signalVar, path string) (string, error) {
	if u := getenv(signalVar); u != "" {
		return u, checkEndpoint(signalVar, u)
	}
	if u := getenv(EnvEndpoint); u != "" {
		return strings.TrimRight(u, "/") + path, checkEndpoint(EnvEndpoint, u)
	}
	return "", nil
}

// checkEndpoint reports whether v, the value of the variable name, is an
// http or https URL with a host. The error never shows a password of v:
// url.Parse's error quotes the whole value, so only its cause is kept.
func checkEndpoint(name, v string) error {
	u, err := url.Parse(v)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("idemotel: %s: not a URL: %w", name, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("idemotel: %s=%q: want an http:// or https:// URL with a host, such as http://collector:4318", name, u.Redacted())
	}
	return nil
}

// checkProtocol returns an error naming the variable when a signal's OTLP
// protocol (signalVar, else EnvProtocol) is set to anything but an OTLP/HTTP
// encoding. The OTLP/HTTP exporters read these variables themselves, and
// take grpc (what a collector's port 4317 speaks, and what OpenTelemetry
// operators often set) for http/protobuf with a warning OpenTelemetry's
// default logger does not show: every batch then went, as OTLP/HTTP, to a
// gRPC receiver, and failed.
func checkProtocol(getenv func(string) string, signalVar string) error {
	name, v := signalVar, getenv(signalVar)
	if v == "" {
		name, v = EnvProtocol, getenv(EnvProtocol)
	}
	switch v {
	case "", "http/protobuf", "http/json":
		return nil
	}
	return fmt.Errorf("idemotel: %s=%q: idem exports OTLP over HTTP only: set http/protobuf (or http/json), or unset it, "+
		"and point the endpoint at the collector's OTLP/HTTP port (4318), not its gRPC port (4317)", name, v)
}

// resourceServiceName returns the service.name of an
// OTEL_RESOURCE_ATTRIBUTES value (comma-separated key=value pairs, values
// percent-encoded), read as the OpenTelemetry SDK reads it; "" when it
// names none.
func resourceServiceName(attrs string) string {
	name := ""
	for p := range strings.SplitSeq(attrs, ",") {
		k, v, ok := strings.Cut(p, "=")
		if !ok || strings.TrimSpace(k) != "service.name" {
			continue
		}
		v = strings.TrimSpace(v)
		if u, err := url.PathUnescape(v); err == nil {
			v = u
		}
		name = v // the last one wins, as in the SDK's resource
	}
	return name
}
