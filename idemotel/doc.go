// Package idemotel connects idem's tracing hooks (package observe) to
// OpenTelemetry. It is a module of its own, github.com/idemkit/idem/idemotel,
// so that only the programs that import it link OpenTelemetry: the core
// module github.com/idemkit/idem does not require it (as franz-go keeps its
// kotel plugin apart).
//
// NewTracer adapts a trace.TracerProvider to observe.Tracer; set it as the
// Tracer of the components to trace (idemhttp.Config, inbox.Config,
// outbox.RelayConfig, saga.Config, cleanup.Config). Propagator adapts a
// propagation.TextMapPropagator (the W3C trace context by default) to
// observe.Propagator. Install registers both as observe's defaults, which
// outbox.EnqueueTx uses to store the trace context with the events it
// enqueues, and the relay and the inbox to read it back:
//
//	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter))
//	tracer := idemotel.Install(tp, nil) // the W3C trace context
//	mw, err := idemhttp.New(drv, &idemhttp.Config{Tracer: tracer})
//
// franz-go's kotel plugin may trace the idemkafka.Publisher's client
// (kgo.WithHooks in PublisherConfig.ExtraOpts): its publish span
// continues the trace stored with each event, as a child of the
// idem.outbox.enqueue span, and the traceparent it writes into the record
// is that span's, so a consumer continues the request's trace (this needs
// Install, for observe's default Propagator).
//
// Setup is what idemd uses: it builds the OTLP/HTTP trace and metric
// exporters from the standard OTEL_* environment variables when
// telemetry is enabled, and exports the metrics of a Prometheus gatherer
// through OpenTelemetry under their Prometheus names. The exporters connect
// lazily: a collector that is not there costs dropped batches and a logged
// error, never a failed start. An endpoint variable that is not an http://
// or https:// URL with a host fails Setup, as does an
// OTEL_EXPORTER_OTLP_PROTOCOL (or a signal's own) that is not an OTLP/HTTP
// encoding (grpc).
package idemotel
