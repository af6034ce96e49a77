package idemhttp

import (
	"context"
	"fmt"
	"net/http"
	"reflect"
	"strings"

	"github.com/idemkit/idem/observe"
)

// Tracing (Config.Tracer): one idem.http.request span per protected request,
// with the children idem.http.claim, idem.http.execute (the handler runs in
// its context, so the events it enqueues carry it), idem.http.replay and
// idem.http.conflict. Without a Tracer none of this runs: the helpers below
// return observe.NoopSpan and allocate nothing.

// requestTrace is the request span and the outcome reported for it, in the
// request's context; err is the failure of the store or of the command's
// transaction that decided the outcome (traceFailure), recorded on the
// span when it ends.
type requestTrace struct {
	span    observe.Span
	outcome Outcome
	set     bool
	err     error
}

type requestTraceKey struct{}

// serveTraced serves r like Handler does, in an idem.http.request span.
func (m *Middleware[TTx]) serveTraced(w http.ResponseWriter, r *http.Request, next http.Handler) {
	ctx, span := m.cfg.Tracer.Start(r.Context(), "idem.http.request", observe.String("http.request.method", r.Method))
	rt := &requestTrace{span: span}
	r = r.WithContext(context.WithValue(ctx, requestTraceKey{}, rt))
	defer func() {
		var attrs []observe.Attr
		if route := m.spanRoute(r); route != "" {
			attrs = append(attrs, observe.String("http.route", route))
		}
		if rt.set {
			attrs = append(attrs, observe.String("idem.outcome", rt.outcome.String()),
				observe.Bool("idem.replayed", rt.outcome == OutcomeReplayed))
		}
		span.SetAttributes(attrs...)
		p := recover()
		if p == nil && rt.err != nil {
			span.RecordError(rt.err)
		}
		endPanicking(span, p)
	}()
	m.serve(w, r, next)
}

// spanRoute is the http.route of r's span: Config.Route, except when that
// is DefaultRoute and no ServeMux routed r. DefaultRoute then gives the URL
// path, one value per resource (/orders/81, /orders/82, ...): fine for the
// scope, but http.route must be a template, and a backend that derives
// metrics from spans would get one series per path. A route that is r's
// ServeMux pattern ("[METHOD ][HOST]/PATH") gives its path template alone:
// http.route is the path template, and the method is already in
// http.request.method ("POST /orders" would show as "POST POST /orders").
func (m *Middleware[TTx]) spanRoute(r *http.Request) string {
	if r.Pattern == "" && reflect.ValueOf(m.cfg.Route).Pointer() == reflect.ValueOf(DefaultRoute).Pointer() {
		return ""
	}
	route := m.cfg.Route(r)
	if route == r.Pattern {
		if i := strings.IndexByte(route, '/'); i > 0 {
			route = route[i:]
		}
	}
	return route
}

// traceOutcome records o on the request span of r.
func traceOutcome(r *http.Request, o Outcome) {
	if rt, ok := r.Context().Value(requestTraceKey{}).(*requestTrace); ok {
		rt.outcome, rt.set = o, true
	}
}

// traceFailure records err, the failure of the store or of the command's
// transaction that decides cmd's answer (503 store-unavailable or
// outcome-unknown, 500 transaction-aborted, a response not stored), on its
// execute span while that is open, and on its request span, which ends
// failed: without it only a failed claim's span said so, and a command
// whose COMMIT failed looked like one that went well. The first failure
// of a request is the one recorded. Untraced, it does nothing.
func (m *Middleware[TTx]) traceFailure(cmd *command, err error) {
	if m.cfg.Tracer == nil || err == nil {
		return
	}
	rt, ok := cmd.r.Context().Value(requestTraceKey{}).(*requestTrace)
	if !ok || rt.err != nil {
		return
	}
	rt.err = err
	if s := cmd.held.span; s != nil {
		s.RecordError(err)
	}
}

// span starts the child span name of cmd's request span.
func (m *Middleware[TTx]) span(cmd *command, name string) observe.Span {
	if m.cfg.Tracer == nil {
		return observe.NoopSpan
	}
	_, s := m.cfg.Tracer.Start(cmd.r.Context(), name)
	return s
}

// enter starts the child span name of cmd's request span and makes it the
// context of cmd.r (the handler's) until holdGuard ends it (with the panic
// as its error when the handler panicked) and restores cmd.r.
func (m *Middleware[TTx]) enter(cmd *command, name string) (observe.Span, *http.Request) {
	if m.cfg.Tracer == nil {
		return observe.NoopSpan, nil
	}
	ctx, s := m.cfg.Tracer.Start(cmd.r.Context(), name)
	orig := cmd.r
	cmd.r = cmd.r.WithContext(ctx)
	return s, orig
}

// endPanicking ends s; when p, a recovered panic, is not nil, it records p
// as the error of s first and panics on with it.
func endPanicking(s observe.Span, p any) {
	if p == nil {
		s.End()
		return
	}
	observe.End(s, fmt.Errorf("panic: %v", p))
	panic(p)
}

// endClaim ends a claim span with whether the key was claimed.
func (m *Middleware[TTx]) endClaim(s observe.Span, claimed bool, err error) {
	if m.cfg.Tracer != nil {
		s.SetAttributes(observe.Bool("idem.claimed", claimed))
		observe.End(s, err)
	}
}

// conflict records an idem.http.conflict span of the given kind.
func (m *Middleware[TTx]) conflict(cmd *command, kind string) {
	if m.cfg.Tracer != nil {
		s := m.span(cmd, "idem.http.conflict")
		s.SetAttributes(observe.String("idem.conflict", kind))
		s.End()
	}
}
