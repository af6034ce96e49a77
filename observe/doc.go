// Package observe is idem's tracing hook: a Tracer and Span interface small
// enough that the core module needs no tracing library, a Propagator for
// the W3C trace context (traceparent, tracestate) that travels with an
// event from the request that enqueued it, through the outbox row and the
// Kafka record headers, to the consumer, and a process-wide default
// Propagator (and Tracer) for the code paths that take no configuration,
// such as outbox.EnqueueTx.
//
// Every component has a Tracer field in its configuration
// (idemhttp.Config, inbox.Config, outbox.RelayConfig, saga.Config,
// cleanup.Config). Nil, the default, traces nothing and costs nothing: no
// span is started and nothing is allocated for it. The OpenTelemetry
// implementation lives in the separate module
// github.com/idemkit/idem/idemotel, so that only the programs that use it
// link OpenTelemetry (as franz-go keeps its kotel plugin apart);
// idemotel.Install registers it as the default with SetDefault.
//
// Spans never carry an idempotency key, a request or response body, or an
// event payload: only names, counts and outcomes.
//
// # Span names
//
//   - idem.http.request: one per protected request, with the attributes
//     idem.outcome, idem.replayed, http.route and http.request.method; its
//     children idem.http.claim (the claim of the key), idem.http.execute
//     (the handler, the stored response and the commit), idem.http.replay
//     (a stored response written again) and idem.http.conflict (a key in
//     progress or reused with another request). A request answered with a
//     failure of the store or of its transaction (503 store-unavailable or
//     outcome-unknown, 500 transaction-aborted, a response not stored), or
//     with a 5xx of its handler, ends failed with that error, as does its
//     idem.http.claim or idem.http.execute span, wherever the failure
//     happened.
//   - idem.outbox.enqueue: outbox.EnqueueTx, with the default Tracer.
//   - idem.outbox.relay.batch: one relay round that claimed events.
//   - idem.inbox.batch: one inbox call (Process, ProcessBatch, ProcessBulk
//     and their Tx variants), and idem.inbox.handle, one per new event that
//     ProcessBatch hands to its handler.
//   - idem.saga.step: one saga step or compensation.
//   - idem.cleanup.sweep: one retention sweep.
//
// # Across the asynchronous hop
//
// When a default Propagator is set, outbox.EnqueueTx writes the trace
// context of its ctx into the envelope's Headers (unless they already hold
// a traceparent), so that it is stored with the outbox row and published as
// Kafka record headers. A batch span (relay or inbox) whose events all
// belong to one trace continues it, as a child of the first event's
// producer span; a batch mixing traces starts a trace of its own. In both
// cases the batch span links to every event's producer span. A
// ProcessBatch handler span (idem.inbox.handle) is a child of its event's
// producer span, so one order is one trace from its HTTP request to the
// consumers, and the events that those consumers enqueue continue it.
// When the idemkafka.Publisher's client has a produce hook (franz-go's
// kotel tracer), each record's Context carries its event's trace context,
// read with the default Propagator, so that the hook's publish span and
// the traceparent it writes continue that trace too.
package observe
