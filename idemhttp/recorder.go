package idemhttp

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"sync"
)

// errWriteAfterReturn is returned by a write to the recorder after the
// handler returned (from a goroutine the handler left behind).
var errWriteAfterReturn = errors.New("idemhttp: response written after the handler returned")

// recorder buffers the handler's response: nothing reaches the client before
// the outcome is committed. Once the handler returned the middleware seals it:
// what a goroutine left behind by the handler writes afterwards is dropped,
// so the stored response is exactly what the handler wrote before returning.
type recorder struct {
	mu       sync.Mutex
	sealed   bool
	header   http.Header
	status   int
	body     bytes.Buffer
	limit    int
	overflow bool
}

func newRecorder(limit int) *recorder {
	return &recorder{header: make(http.Header), limit: limit}
}

func (rec *recorder) Header() http.Header {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.sealed {
		return make(http.Header) // too late: not stored, not sent
	}
	return rec.header
}

func (rec *recorder) WriteHeader(status int) {
	if status < 100 || status > 999 {
		// As net/http does: a code it cannot send is a handler bug, not a
		// 200 to store and replay (the panic rolls back or releases).
		panic(fmt.Sprintf("invalid WriteHeader code %v", status))
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if !rec.sealed && rec.status == 0 && status >= 200 {
		rec.status = status
	}
}

func (rec *recorder) Write(p []byte) (int, error) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.sealed {
		return 0, errWriteAfterReturn
	}
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	if rec.overflow || rec.body.Len()+len(p) > rec.limit {
		rec.overflow = true
		return len(p), nil
	}
	return rec.body.Write(p)
}

// seal ends the handler's writes: the middleware calls it when the handler
// returned, before it reads the response.
func (rec *recorder) seal() {
	rec.mu.Lock()
	rec.sealed = true
	rec.mu.Unlock()
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
		if k == varyHeader {
			v = addVary(h, v)
		}
		h[k] = v
	}
	w.WriteHeader(rec.statusCode())
	_, _ = w.Write(rec.body.Bytes())
}
