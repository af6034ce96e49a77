package apijson

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"

	"github.com/idemkit/idem/problem"
)

// resetBody yields start, then fails as a connection the client reset.
func resetBody(start string) io.Reader {
	return io.MultiReader(strings.NewReader(start), iotestErr{&net.OpError{Op: "read", Net: "tcp",
		Source: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080},
		Addr:   &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5555},
		Err:    syscall.ECONNRESET}})
}

type iotestErr struct{ err error }

func (r iotestErr) Read([]byte) (int, error) { return 0, r.err }

// written is the problem WriteRequestError answers for err.
func written(t *testing.T, err error) (int, problem.Problem, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	WriteRequestError(rec, err, "Invalid thing")
	var p problem.Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("%s: %v", rec.Body, err)
	}
	return rec.Code, p, rec.Body.String()
}

func assertNoLeak(t *testing.T, body string) {
	t.Helper()
	for _, leak := range []string{"127.0.0.1", "tcp", "5555", "connection reset", "secret"} {
		if strings.Contains(strings.ToLower(body), leak) {
			t.Errorf("the problem contains %q: %s", leak, body)
		}
	}
}

func TestReadBodyBrokenConnection(t *testing.T) {
	t.Parallel()
	_, rerr := ReadBody(resetBody(`{"secret":"`), 100)
	if rerr == nil || rerr.Status != http.StatusBadRequest {
		t.Fatalf("ReadBody: %v, want a 400", rerr)
	}
	if _, ok := errors.AsType[*net.OpError](rerr); !ok {
		t.Errorf("the cause %v is not kept for the log", rerr.Err)
	}
	status, p, body := written(t, rerr)
	if status != http.StatusBadRequest || p.Type != problem.TypeValidation || p.Title != TitleUnreadable || p.Detail != DetailUnreadable {
		t.Errorf("%d %s", status, body)
	}
	assertNoLeak(t, body)
}

func TestObjectBrokenReader(t *testing.T) {
	t.Parallel()
	_, rerr := Object(json.NewDecoder(resetBody(`{"a":1,"secret":`)), "the body", []string{"a", "secret"})
	if rerr == nil || rerr.Status != http.StatusBadRequest || rerr.Err == nil {
		t.Fatalf("Object: %+v, want a 400 with its cause", rerr)
	}
	_, _, body := written(t, rerr)
	assertNoLeak(t, body)
	// A syntax error describes the client's input: it is shown.
	_, rerr = Object(json.NewDecoder(strings.NewReader(`{"a":}`)), "the body", []string{"a"})
	if rerr == nil || !strings.Contains(rerr.Detail, "malformed JSON: invalid character '}'") {
		t.Errorf("Object: %+v, want the syntax error", rerr)
	}
}

func TestWriteRequestErrorHidesOtherErrors(t *testing.T) {
	t.Parallel()
	status, _, body := written(t, errors.New("dial tcp 127.0.0.1:5432: connect: connection refused"))
	if status != http.StatusBadRequest {
		t.Errorf("%d %s, want 400", status, body)
	}
	assertNoLeak(t, body)
}

// A too-large body is idemhttp's body-too-large problem, with its title and
// detail, whether ReadBody counted the bytes or an http.MaxBytesReader did.
func TestTooLarge(t *testing.T) {
	t.Parallel()
	for name, r := range map[string]io.Reader{
		"ReadBody":            strings.NewReader(strings.Repeat("a", 11)),
		"http.MaxBytesReader": http.MaxBytesReader(httptest.NewRecorder(), io.NopCloser(strings.NewReader(strings.Repeat("a", 11))), 10),
	} {
		max := int64(10)
		if name != "ReadBody" {
			max = 100
		}
		_, rerr := ReadBody(r, max)
		if rerr == nil {
			t.Fatalf("%s: no error", name)
		}
		status, p, body := written(t, rerr)
		if status != http.StatusRequestEntityTooLarge || p.Status != status || p.Type != problem.TypeBodyTooLarge ||
			p.Title != "Request body too large" || p.Detail != "The body exceeds 10 bytes." {
			t.Errorf("%s: %d %s", name, status, body)
		}
	}
	if _, rerr := ReadBody(strings.NewReader(strings.Repeat("a", 10)), 10); rerr != nil {
		t.Errorf("a body of the limit: %v", rerr)
	}
}

func TestRequireJSON(t *testing.T) {
	t.Parallel()
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	h := RequireJSON("thing", next)
	for ct, want := range map[string]int{
		"":                                  415,
		"text/plain":                        415,
		"application/x-www-form-urlencoded": 415,
		"application/json; charset":         415, // malformed parameters
		"json":                              415,
		"x+json":                            415, // no subtype: idemhttp fingerprints it raw
		"+json; charset=utf-8":              415,
		"application/json":                  204,
		"Application/JSON; charset=utf-8":   204,
		"application/merge-patch+json":      204,
	} {
		req := httptest.NewRequest(http.MethodPost, "/things", strings.NewReader(`{}`))
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("Content-Type %q: %d %s, want %d", ct, rec.Code, rec.Body, want)
			continue
		}
		if want == 415 {
			var p problem.Problem
			_ = json.Unmarshal(rec.Body.Bytes(), &p)
			if rec.Header().Get("Content-Type") != problem.MediaType || p.Title != "Unsupported Media Type" ||
				p.Detail != "Send the thing as application/json." {
				t.Errorf("Content-Type %q: %s", ct, rec.Body)
			}
		}
	}
}

func TestRequireJSONRefusesContentEncoding(t *testing.T) {
	t.Parallel()
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	h := RequireJSON("thing", next)
	for ce, want := range map[string]int{
		"":               204,
		"identity":       204,
		"Identity, ":     204,
		"gzip":           415,
		"identity, gzip": 415,
		"br":             415,
	} {
		req := httptest.NewRequest(http.MethodPost, "/things", strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		if ce != "" {
			req.Header.Set("Content-Encoding", ce)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("Content-Encoding %q: %d %s, want %d", ce, rec.Code, rec.Body, want)
			continue
		}
		if want == 415 && (rec.Header().Get("Accept-Encoding") != "identity" || !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/problem+json")) {
			t.Errorf("Content-Encoding %q: headers %v, want a problem with Accept-Encoding: identity", ce, rec.Header())
		}
	}
}

func TestRequireJSONRefusesOtherCharsets(t *testing.T) {
	t.Parallel()
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	h := RequireJSON("thing", next)
	for ct, want := range map[string]int{
		"application/json":                             204,
		"application/json; charset=utf-8":              204,
		"application/json; Charset=\"UTF-8\"":          204,
		"application/problem+json;charset=Utf-8":       204,
		"application/json; charset=iso-8859-1":         415,
		"application/json; charset=utf-16":             415,
		"application/json; charset=us-ascii":           415,
		"application/merge-patch+json; charset=koi8-r": 415,
	} {
		req := httptest.NewRequest(http.MethodPost, "/things", strings.NewReader(`{}`))
		req.Header.Set("Content-Type", ct)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("Content-Type %q: %d %s, want %d", ct, rec.Code, rec.Body, want)
			continue
		}
		if want == 415 {
			var p problem.Problem
			_ = json.Unmarshal(rec.Body.Bytes(), &p)
			if rec.Header().Get("Content-Type") != problem.MediaType || p.Status != 415 || p.Title != "Unsupported Media Type" ||
				p.Detail != "Send the thing as application/json in UTF-8 (charset=utf-8, or no charset)." {
				t.Errorf("Content-Type %q: %s", ct, rec.Body)
			}
		}
	}
}

func TestHasLoneSurrogate(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		v    string
		want bool
	}{
		{`""`, false},
		{`"abc"`, false},
		{`"\ud83d\ude00"`, false},        // a pair
		{`"\uD83D\uDE00x\u00e9"`, false}, // upper-case hex
		{`"\\ud800"`, false},             // a backslash, then text
		{`"\\\ud83d\ude00"`, false},
		{`"\"\n\u0041"`, false},
		{"\"\U0001F600\"", false}, // not escaped
		{`"\ud800"`, true},
		{`"\udbff"`, true},
		{`"\udc00"`, true},
		{`"\udfffx"`, true},
		{`"\ud800\u0041"`, true},
		{`"\ud800\ud800\udc00"`, true},
		{`"\udc00\ud800"`, true},
		{`"\ud800\n"`, true},
		{`"\\\ud800"`, true},
		{`"a\ud83d\ude00\ud83d"`, true},
	} {
		if got := HasLoneSurrogate([]byte(tt.v)); got != tt.want {
			t.Errorf("HasLoneSurrogate(%s) = %v, want %v", tt.v, got, tt.want)
		}
	}
}

func TestCheckBody(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ body, mention string }{
		{"", "empty"},
		{" \t\r\n", "empty"},
		{"\uFEFF{}", "byte order mark"},
		{"{\"a\":\"\xff\"}", "UTF-8"},
		{"{}", ""},
		{" {} ", ""},
		{"{\"a\":\"\uFEFF\"}", ""},
	} {
		rerr := CheckBody([]byte(tt.body))
		switch {
		case tt.mention == "" && rerr != nil:
			t.Errorf("CheckBody(%q) = %v, want nil", tt.body, rerr)
		case tt.mention != "" && (rerr == nil || rerr.Status != http.StatusBadRequest || !strings.Contains(rerr.Detail, tt.mention)):
			t.Errorf("CheckBody(%q) = %v, want a 400 mentioning %q", tt.body, rerr, tt.mention)
		}
	}
}

// An unknown or duplicate member's name is quoted in the detail, cut to a
// readable length: a 64 KiB name of '<' (six bytes each once escaped in
// the problem) made a 390 KB problem, stored under the key for its
// retention and answered to every replay.
func TestObjectQuotesNamesShort(t *testing.T) {
	t.Parallel()
	for _, name := range []string{strings.Repeat("<", 65000), strings.Repeat(`\u2028`, 10000), strings.Repeat("é", 30000)} {
		for _, body := range []string{`{"` + name + `":1}`, `{"a":1,"a":2,"` + name + `":1,"` + name + `":2}`} {
			_, rerr := Object(json.NewDecoder(strings.NewReader(body)), "the body", []string{"a"})
			if rerr == nil {
				t.Fatal("accepted")
			}
			w := httptest.NewRecorder()
			WriteRequestError(w, rerr, "x")
			if n := w.Body.Len(); n > 2<<10 {
				t.Errorf("a %d-byte body got a %d-byte problem: %.200s", len(body), n, w.Body)
			}
		}
	}
	_, rerr := Object(json.NewDecoder(strings.NewReader(`{"currency":1}`)), "the body", []string{"a"})
	if rerr == nil || !strings.Contains(rerr.Detail, `"currency"`) {
		t.Errorf("short name: %v", rerr)
	}
}
