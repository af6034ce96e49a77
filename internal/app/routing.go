package app

import (
	"net/http"

	"github.com/idemkit/idem/problem"
)

// router serves mux, answering its own 404 (no route) and 405 (route
// exists for other methods, Allow header kept) as problem+json instead of
// text/plain. Handlers' own responses are untouched.
type router struct{ mux *http.ServeMux }

func problemRouting(mux *http.ServeMux) *router { return &router{mux: mux} }

// pattern returns the pattern of mux that r matches, "" when none does.
func (rt *router) pattern(r *http.Request) string {
	_, pattern := rt.mux.Handler(r)
	return pattern
}

func (rt *router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rt.serve(w, r, rt.pattern(r))
}

// serve serves r, whose pattern (rt.pattern) is known: routed once.
func (rt *router) serve(w http.ResponseWriter, r *http.Request, pattern string) {
	if pattern != "" {
		rt.mux.ServeHTTP(w, r)
		return
	}
	rt.mux.ServeHTTP(&routingErrorWriter{ResponseWriter: w, r: r}, r)
}

// routingErrorWriter replaces a 404 or 405 written by the ServeMux with a
// problem.
type routingErrorWriter struct {
	http.ResponseWriter
	r        *http.Request
	replaced bool
}

func (w *routingErrorWriter) WriteHeader(status int) {
	switch status {
	case http.StatusNotFound:
		w.replaced = true
		problem.WriteError(w.ResponseWriter, status, "", "Not Found",
			"There is no route for "+w.r.Method+" "+w.r.URL.Path+".")
	case http.StatusMethodNotAllowed:
		w.replaced = true
		problem.WriteError(w.ResponseWriter, status, "", "Method Not Allowed",
			w.r.Method+" is not allowed on "+w.r.URL.Path+"; allowed: "+w.Header().Get("Allow")+".")
	default:
		w.ResponseWriter.WriteHeader(status)
	}
}

func (w *routingErrorWriter) Write(b []byte) (int, error) {
	if w.replaced {
		return len(b), nil // the ServeMux's text body
	}
	return w.ResponseWriter.Write(b)
}
