package idemhttp

import (
	"bytes"
	"net/http"
)

// recorder buffers the handler's response: nothing reaches the client before
// the outcome is committed.
type recorder struct {
	header   http.Header
	status   int
	body     bytes.Buffer
	limit    int
	overflow bool
}

func newRecorder(limit int) *recorder {
	return &recorder{header: make(http.Header), limit: limit}
}

func (rec *recorder) Header() http.Header { return rec.header }

func (rec *recorder) WriteHeader(status int) {
	if rec.status == 0 && status >= 200 {
		rec.status = status
	}
}

func (rec *recorder) Write(p []byte) (int, error) {
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	if rec.overflow || rec.body.Len()+len(p) > rec.limit {
		rec.overflow = true
		return len(p), nil
	}
	return rec.body.Write(p)
}

// statusCode is the status the handler answered, 200 if it wrote nothing.
func (rec *recorder) statusCode() int {
	if rec.status == 0 {
		return http.StatusOK
	}
	return rec.status
}

// flush sends the buffered response to w.
func (rec *recorder) flush(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range rec.header {
		h[k] = v
	}
	w.WriteHeader(rec.statusCode())
	_, _ = w.Write(rec.body.Bytes())
}
