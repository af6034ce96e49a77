package main_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/observe"
)

// One order, followed from its HTTP request (with a W3C traceparent)
// through the outbox, the relay, the embedded Kafka broker and the inboxes
// to the projection and the saga: every span is in the request's trace,
// and the batch spans link to the producer span of their events.
// Not parallel: it sets observe's process-wide default.
func TestOneOrderIsOneTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tracer := idemotel.Install(tp, nil)
	t.Cleanup(func() { observe.SetDefault(nil, nil) })

	cfg, err := app.ParseConfig([]string{"-db", "sqlite:" + filepath.Join(t.TempDir(), "idemd.db"), "-cleanup", "off",
		"-kafka-dir", t.TempDir()}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.New(t.Context(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)),
		app.WithTelemetry(&app.Telemetry{Tracer: tracer, Propagator: idemotel.Propagator(nil)}))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		a.Close()
	})
	base := "http://" + ln.Addr().String()

	const (
		traceID    = "4bf92f3577b34da6a3ce929d0e0e4736"
		callerSpan = "00f067aa0ba902b7"
		key        = "order-key-7d1f0c"
		body       = `{"customer_id":42,"amount":"19.90","items":[{"sku":"SKU-SECRET-9","quantity":2}]}`
	)
	req, err := http.NewRequest(http.MethodPost, base+"/v1/orders", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("traceparent", "00-"+traceID+"-"+callerSpan+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /v1/orders: %d", resp.StatusCode)
	}

	// The projection shows the confirmed order once both of its events
	// (OrderCreated.v1, and OrderConfirmed.v1 that the saga emitted) went
	// through the inbox.
	waitFor(t, 20*time.Second, "the projection's confirmed order", func() bool {
		r, err := http.Get(base + "/v1/customers/42/summary")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(r.Body)
		_ = r.Body.Close()
		return r.StatusCode == http.StatusOK && strings.Contains(string(b), `"confirmed":1`)
	})
	var spans []sdktrace.ReadOnlySpan
	waitFor(t, 10*time.Second, "the projection's batch spans", func() bool {
		spans = rec.Ended()
		return attrInt(spans, app.ProjectionInbox) >= 2
	})

	// One trace: every span of idem is in the request's trace (but those
	// of the test's own GET requests, each a trace of its own).
	for _, s := range spans {
		if strings.HasPrefix(s.Name(), "GET ") {
			continue
		}
		if got := s.SpanContext().TraceID().String(); got != traceID {
			t.Errorf("span %s is in trace %s; want the request's %s", s.Name(), got, traceID)
		}
		for _, kv := range s.Attributes() {
			if v := kv.Value.String(); strings.Contains(v, key) || strings.Contains(v, "SKU-SECRET") {
				t.Errorf("span %s attribute %s = %q holds the key or the body", s.Name(), kv.Key, v)
			}
		}
	}

	// idemd's server span continues the caller's; the middleware's
	// idem.http.request is its child.
	server := one(t, spans, "POST /v1/orders", nil)
	if server.Parent().SpanID().String() != callerSpan || !server.Parent().IsRemote() {
		t.Errorf("server span parent %v; want the caller's remote span %s", server.Parent(), callerSpan)
	}
	if server.SpanKind() != trace.SpanKindServer {
		t.Errorf("server span kind %v; want server (trace backends build request metrics and service maps from it)", server.SpanKind())
	}
	// The messaging spans carry the kinds trace backends draw their
	// producer -> consumer edges from: the enqueue creates the message
	// (its context travels with it), the relay sends it (its own context
	// does not), the inbox processes it.
	for name, want := range map[string]trace.SpanKind{
		"idem.outbox.enqueue":     trace.SpanKindProducer,
		"idem.outbox.relay.batch": trace.SpanKindClient,
		"idem.inbox.batch":        trace.SpanKindConsumer,
		"idem.inbox.handle":       trace.SpanKindConsumer,
		"idem.saga.step":          trace.SpanKindInternal,
	} {
		n := 0
		for _, s := range spans {
			if s.Name() != name {
				continue
			}
			n++
			if s.SpanKind() != want {
				t.Errorf("span %s kind %v; want %v", name, s.SpanKind(), want)
			}
		}
		if n == 0 {
			t.Errorf("no %s span", name)
		}
	}
	if attr(server, "http.route") != "/v1/orders" || attr(server, "http.response.status_code") != "201" {
		t.Errorf("server span attributes %v", server.Attributes())
	}
	request := one(t, spans, "idem.http.request", nil)
	childOf(t, request, server)
	if attr(request, "idem.outcome") != "executed" || attr(request, "idem.replayed") != "false" || attr(request, "http.route") != "/v1/orders" {
		t.Errorf("idem.http.request attributes %v", request.Attributes())
	}
	// One claim, or more on SQLite: a claim that finds the database's one
	// connection held by the relay or a consumer for its first few
	// milliseconds is not locked, and the request claims again, waiting.
	claims := 0
	for _, s := range spans {
		if s.Name() == "idem.http.claim" {
			claims++
			childOf(t, s, request)
		}
	}
	if claims == 0 {
		t.Error("no idem.http.claim span")
	}
	execute := one(t, spans, "idem.http.execute", nil)
	childOf(t, execute, request)
	// The order's enqueue is the one under the request; the saga's are
	// under its inbox handler spans.
	enqueue := one(t, spans, "idem.outbox.enqueue", func(s sdktrace.ReadOnlySpan) bool {
		return s.Parent().SpanID() == execute.SpanContext().SpanID()
	})

	// The relay batch that published OrderCreated.v1 continues its trace
	// and links to the enqueue span stored with the row.
	linked := func(s sdktrace.ReadOnlySpan) bool { return linksTo(s, enqueue.SpanContext()) }
	relay := one(t, spans, "idem.outbox.relay.batch", linked)
	if relay.Parent().SpanID() != enqueue.SpanContext().SpanID() {
		t.Errorf("relay batch parent %v; want the enqueue span", relay.Parent())
	}
	// So does the projection's inbox batch that applied it, and the saga's.
	proj := one(t, spans, "idem.inbox.batch", func(s sdktrace.ReadOnlySpan) bool {
		return attr(s, "idem.consumer") == app.ProjectionInbox && linked(s)
	})
	if proj.Parent().SpanID() != enqueue.SpanContext().SpanID() {
		t.Errorf("projection batch parent %v; want the enqueue span", proj.Parent())
	}
	one(t, spans, "idem.inbox.handle", func(s sdktrace.ReadOnlySpan) bool {
		return attr(s, "idem.consumer") == app.SagaInbox && s.Parent().SpanID() == enqueue.SpanContext().SpanID()
	})
	if n := countNamed(spans, "idem.saga.step"); n == 0 {
		t.Error("no idem.saga.step span")
	}
}

func waitFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !ok(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s", what, d)
		}
	}
}

func attr(s sdktrace.ReadOnlySpan, k string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == k {
			return kv.Value.String()
		}
	}
	return ""
}

// attrInt sums idem.applied over the inbox batches of consumer.
func attrInt(spans []sdktrace.ReadOnlySpan, consumer string) int {
	n := 0
	for _, s := range spans {
		if s.Name() == "idem.inbox.batch" && attr(s, "idem.consumer") == consumer {
			var v int
			_, _ = fmt.Sscan(attr(s, "idem.applied"), &v)
			n += v
		}
	}
	return n
}

func countNamed(spans []sdktrace.ReadOnlySpan, name string) int {
	n := 0
	for _, s := range spans {
		if s.Name() == name {
			n++
		}
	}
	return n
}

// one returns the only span named name that match accepts (any if nil).
func one(t *testing.T, spans []sdktrace.ReadOnlySpan, name string, match func(sdktrace.ReadOnlySpan) bool) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name && (match == nil || match(s)) {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		names := make([]string, len(spans))
		for i, s := range spans {
			names[i] = fmt.Sprintf("%s(%s<-%s links %d)", s.Name(), s.SpanContext().SpanID(), s.Parent().SpanID(), len(s.Links()))
		}
		t.Fatalf("%d matching %s spans; want 1. Spans: %s", len(found), name, strings.Join(names, " "))
	}
	return found[0]
}

func childOf(t *testing.T, s, parent sdktrace.ReadOnlySpan) {
	t.Helper()
	if s.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Errorf("%s: parent %s, want %s (%s)", s.Name(), s.Parent().SpanID(), parent.SpanContext().SpanID(), parent.Name())
	}
}

func linksTo(s sdktrace.ReadOnlySpan, sc trace.SpanContext) bool {
	for _, l := range s.Links() {
		if l.SpanContext.SpanID() == sc.SpanID() && l.SpanContext.TraceID() == sc.TraceID() {
			return true
		}
	}
	return false
}

// idemd with OTEL_EXPORTER_OTLP_ENDPOINT pointing at a closed port starts,
// serves, traces (the exports fail, logged) and stops in time.
func TestOTelWithoutCollector(t *testing.T) {
	t.Parallel()
	closed := freeAddr(t) // nothing listens there
	dir := t.TempDir()
	cmd := exec.Command(idemdBinary(t), append(commonArgs(freeAddr(t), "sqlite:"+filepath.Join(dir, "idemd.db")), "-kafka-dir", filepath.Join(dir, "kafka"))...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "OTEL_EXPORTER_OTLP_ENDPOINT=http://"+closed, "OTEL_BSP_SCHEDULE_DELAY=50", "OTEL_METRIC_EXPORT_INTERVAL=100")
	stderr := &testlog.Buffer{}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- line
		_, _ = io.Copy(io.Discard, stdout)
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	var base string
	select {
	case line := <-lines:
		m := listenLineRe.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("first line %q; stderr:\n%s", line, stderr.String())
		}
		base = m[1]
	case <-time.After(30 * time.Second):
		t.Fatalf("no listen line within 30s; stderr:\n%s", stderr.String())
	}
	if d := time.Since(started); d > 15*time.Second {
		t.Errorf("start-up took %s without a collector", d)
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/orders", strings.NewReader(`{"customer_id":7,"amount":"1.00","items":[{"sku":"A-1","quantity":1}]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "no-collector-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Errorf("POST /v1/orders: %d", resp.StatusCode)
	}
	if !strings.Contains(stderr.String(), "OpenTelemetry traces and metrics on") {
		t.Errorf("no telemetry line in the log:\n%s", stderr.String())
	}
	time.Sleep(300 * time.Millisecond) // an export attempt or two
	stopAt := time.Now()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("exit: %v; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(40 * time.Second):
		t.Fatalf("no exit within 40s of SIGTERM; stderr:\n%s", stderr.String())
	}
	if d := time.Since(stopAt); d > 25*time.Second {
		t.Errorf("shutdown took %s", d)
	}
}
