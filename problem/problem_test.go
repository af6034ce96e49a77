package problem

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

func TestMarshalJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		p    Problem
		want string
	}{
		{"zero value omits everything", Problem{}, `{}`},
		{
			"standard members in order",
			Problem{Type: "about:blank", Title: "Not Found", Status: 404, Detail: "no such payment", Instance: "/payments/7"},
			`{"type":"about:blank","title":"Not Found","status":404,"detail":"no such payment","instance":"/payments/7"}`,
		},
		{"empty strings omitted", Problem{Status: 409, Detail: "d"}, `{"status":409,"detail":"d"}`},
		{
			"extensions flattened and sorted",
			Problem{Status: 400, Extensions: map[string]any{"zeta": 1, "alpha": "a", "errors": []string{"x"}}},
			`{"status":400,"alpha":"a","errors":["x"],"zeta":1}`,
		},
		{
			"extensions never overwrite standard members",
			Problem{Type: "t", Status: 400, Extensions: map[string]any{"status": 200, "type": "evil", "Title": "x", "DETAIL": "y", "instance": "z", "ok": true}},
			`{"type":"t","status":400,"ok":true}`,
		},
		{
			// encoding/json matches names with Unicode case folding:
			// U+017F (long s) folds to s.
			"extensions never shadow standard members under Unicode folding",
			Problem{Status: 400, Instance: "/p/1", Extensions: map[string]any{"\u017ftatus": 200, "in\u017ftance": "/p/2", "ok": true}},
			`{"status":400,"instance":"/p/1","ok":true}`,
		},
		{
			"extension fills nothing when standard member empty",
			Problem{Extensions: map[string]any{"title": "sneaky"}},
			`{}`,
		},
		{"nil extension value kept", Problem{Extensions: map[string]any{"n": nil}}, `{"n":null}`},
		{"strings are escaped", Problem{Detail: "a\"b\n"}, `{"detail":"a\"b\n"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := json.Marshal(tt.p)
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			if string(got) != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

// Extension names that are not valid UTF-8 encode with U+FFFD in place of
// the bad bytes, so two of them can encode to one name. The document must
// still have each member once: a reader (UnmarshalJSON, idemclient) refuses
// one with a member twice. The first name in key order is kept.
func TestMarshalJSONNamesUnique(t *testing.T) {
	t.Parallel()
	p := Problem{Status: 400, Extensions: map[string]any{
		"field\xff": 1, "field\xfe": 2, "field\ufffd": 3, // one name: field\ufffd
		"two\xff\xfe": 4, "two\ufffd": 5, // two names: two\ufffd\ufffd and two\ufffd
		"ok": true,
	}}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if want := "{\"status\":400,\"field\ufffd\":3,\"ok\":true,\"two\ufffd\":5,\"two\\ufffd\\ufffd\":4}"; string(b) != want {
		t.Errorf("got  %s\nwant %s", b, want)
	}
	var q Problem
	if err := json.Unmarshal(b, &q); err != nil {
		t.Fatalf("the document %s does not decode: %v", b, err)
	}
}

func TestMarshalJSONBadExtension(t *testing.T) {
	t.Parallel()
	for name, v := range map[string]any{
		"func": func() {},
		"chan": make(chan int),
		"NaN":  math.NaN(),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if _, err := json.Marshal(Problem{Extensions: map[string]any{"bad": v}}); err == nil {
				t.Fatal("Marshal succeeded, want error")
			}
		})
	}
}

func TestUnmarshalJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		want    Problem
		wantErr bool
	}{
		{"empty object", `{}`, Problem{}, false},
		{
			"all members",
			`{"type":"t","title":"T","status":409,"detail":"d","instance":"/i","balance":12345678901234567890,"tags":["a"]}`,
			Problem{Type: "t", Title: "T", Status: 409, Detail: "d", Instance: "/i", Extensions: map[string]any{
				"balance": json.Number("12345678901234567890"), "tags": []any{"a"},
			}},
			false,
		},
		{
			"wrong member types are ignored",
			`{"type":1,"title":null,"status":"409","detail":["x"],"instance":{}}`,
			Problem{}, false,
		},
		{"fractional status ignored", `{"status":409.5}`, Problem{}, false},
		{"status out of range ignored", `{"status":42}`, Problem{}, false},
		{"case variants of standard members dropped", `{"Status":200,"TYPE":"x"}`, Problem{}, false},
		{"array", `[]`, Problem{}, true},
		{"null", `null`, Problem{}, true},
		{"string", `"x"`, Problem{}, true},
		{"invalid", `{`, Problem{}, true},
		// A member twice: readers disagree on which one counts (encoding/json
		// keeps the last, a reader of the first members the first), so
		// the document is refused.
		{"duplicate type", `{"type":"a","type":"b"}`, Problem{}, true},
		{"duplicate type, same value", `{"type":"a","status":409,"type":"a"}`, Problem{}, true},
		{"duplicate type written with an escape", `{"type":"a","typ\u0065":"b"}`, Problem{}, true},
		{"duplicate extension", `{"stored":true,"stored":false}`, Problem{}, true},
		{"duplicate of a wrongly typed member", `{"status":"409","status":409}`, Problem{}, true},
		{"members of nested objects are not the document's", `{"a":{"type":"x"},"b":{"type":"y"},"type":"t"}`,
			Problem{Type: "t", Extensions: map[string]any{"a": map[string]any{"type": "x"}, "b": map[string]any{"type": "y"}}}, false},
		{"case variants are distinct names", `{"type":"a","Type":"b"}`, Problem{Type: "a"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got Problem
			err := json.Unmarshal([]byte(tt.in), &got)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err == nil && !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %#v\nwant %#v", got, tt.want)
			}
		})
	}
}

func TestUnmarshalJSONTrailingData(t *testing.T) {
	t.Parallel()
	var p Problem
	if err := p.UnmarshalJSON([]byte(`{} {}`)); err == nil {
		t.Fatal("want error for trailing data")
	}
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	in := Problem{
		Type: TypeKeyReused, Title: "Idempotency-Key reused", Status: 409,
		Detail: "different body", Instance: "urn:uuid:1",
		Extensions: map[string]any{"key": "abc", "n": json.Number("1.50")},
	}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out Problem
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Errorf("round trip\n got  %#v\n want %#v", out, in)
	}
}

func TestWrite(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		p          Problem
		wantStatus int
		wantBody   string
	}{
		{
			"defaults type and title",
			Problem{Status: 404},
			404, `{"type":"about:blank","title":"Not Found","status":404}`,
		},
		{
			"keeps given fields",
			Problem{Type: TypeRequestInProgress, Title: "In progress", Status: 409, Detail: "d"},
			409, `{"type":"` + TypeRequestInProgress + `","title":"In progress","status":409,"detail":"d"}`,
		},
		{
			"zero status becomes 500",
			Problem{},
			500, `{"type":"about:blank","title":"Internal Server Error","status":500}`,
		},
		{
			"non-error status becomes 500",
			Problem{Status: 200, Title: "x"},
			500, `{"type":"about:blank","title":"x","status":500}`,
		},
		{
			"invalid status becomes 500",
			Problem{Status: 1000},
			500, `{"type":"about:blank","title":"Internal Server Error","status":500}`,
		},
		{
			"unknown status has no default title",
			Problem{Status: 599},
			599, `{"type":"about:blank","status":599}`,
		},
		{
			"extensions written",
			Problem{Status: 422, Type: TypeValidation, Extensions: map[string]any{"field": "amount"}},
			422, `{"type":"` + TypeValidation + `","title":"Unprocessable Entity","status":422,"field":"amount"}`,
		},
		{
			"unencodable extensions dropped",
			Problem{Status: 400, Extensions: map[string]any{"bad": func() {}, "good": 1}},
			400, `{"type":"about:blank","title":"Bad Request","status":400}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rec := httptest.NewRecorder()
			rec.Header().Set("Retry-After", "1")
			rec.Header().Set("Content-Type", "text/html")
			Write(rec, tt.p)
			res := rec.Result()
			if res.StatusCode != tt.wantStatus {
				t.Errorf("status = %d, want %d", res.StatusCode, tt.wantStatus)
			}
			if got := res.Header.Get("Content-Type"); got != MediaType {
				t.Errorf("Content-Type = %q", got)
			}
			if got := res.Header.Get("Cache-Control"); got != "no-store" {
				t.Errorf("Cache-Control = %q", got)
			}
			if got := res.Header.Get("Retry-After"); got != "1" {
				t.Errorf("Retry-After = %q, caller's header lost", got)
			}
			if got := strings.TrimSuffix(rec.Body.String(), "\n"); got != tt.wantBody {
				t.Errorf("body\n got  %s\n want %s", got, tt.wantBody)
			}
			var p Problem
			if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
				t.Fatalf("body is not a problem: %v", err)
			}
			if p.Status != res.StatusCode {
				t.Errorf("body status %d != response status %d", p.Status, res.StatusCode)
			}
		})
	}
}

func TestWriteError(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	WriteError(rec, http.StatusBadRequest, TypeKeyMissing, "Idempotency-Key missing", "send one")
	if rec.Code != 400 {
		t.Errorf("status = %d", rec.Code)
	}
	want := `{"type":"` + TypeKeyMissing + `","title":"Idempotency-Key missing","status":400,"detail":"send one"}` + "\n"
	if rec.Body.String() != want {
		t.Errorf("body\n got  %s\n want %s", rec.Body.String(), want)
	}
	if rec.Header().Get("Content-Type") != MediaType {
		t.Errorf("Content-Type = %q", rec.Header().Get("Content-Type"))
	}
}

// slugs maps every exported type constant to its slug.
var slugs = map[string]string{
	TypeKeyMissing:         "key-missing",
	TypeKeyMalformed:       "key-malformed",
	TypeKeyMultiple:        "key-multiple",
	TypeKeyReused:          "key-reused",
	TypeRequestInProgress:  "request-in-progress",
	TypeBodyTooLarge:       "body-too-large",
	TypeBodyTimeout:        "body-timeout",
	TypeResponseTooLarge:   "response-too-large",
	TypeStoreUnavailable:   "store-unavailable",
	TypeOutcomeUnknown:     "outcome-unknown",
	TypeTransactionAborted: "transaction-aborted",
	TypeTransactionEnded:   "transaction-ended",
	TypeUnauthenticated:    "unauthenticated",
	TypeValidation:         "validation",
	TypeConflict:           "conflict",
}

func TestTypeURI(t *testing.T) {
	t.Parallel()
	if got, want := TypeURI("key-missing"), "https://github.com/idemkit/idem/blob/main/docs/problems.md#key-missing"; got != want {
		t.Errorf("TypeURI = %q, want %q", got, want)
	}
	for typ, slug := range slugs {
		if got := TypeURI(slug); got != typ {
			t.Errorf("TypeURI(%q) = %q, constant is %q", slug, got, typ)
		}
	}
}

// TestDocsCoverEveryType checks that docs/problems.md has a section, whose
// heading is the slug (so the anchor is the slug), for every type.
func TestDocsCoverEveryType(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/problems.md")
	if err != nil {
		t.Fatal(err)
	}
	headings := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^## (\S+)\s*$`).FindAllStringSubmatch(string(doc), -1) {
		headings[m[1]] = true
	}
	for _, slug := range slugs {
		if !headings[slug] {
			t.Errorf("docs/problems.md has no section %q", "## "+slug)
		}
		delete(headings, slug)
	}
	for h := range headings {
		t.Errorf("docs/problems.md section %q has no constant", h)
	}
}

// Headers a failing handler set before it gave up describe a body that is
// not the one sent: a Content-Encoding: gzip on the plain JSON problem makes
// clients fail to decode it. Write drops them, as http.Error does, and keeps
// the caller's others (Retry-After).
func TestWriteDropsRepresentationHeaders(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	h := rec.Header()
	h.Set("Content-Encoding", "gzip")
	h.Set("Content-Length", "3")
	h.Set("Content-Range", "bytes 0-2/10")
	h.Set("ETag", `"v1"`)
	h.Set("Last-Modified", "Mon, 02 Jan 2006 15:04:05 GMT")
	h.Set("Content-Language", "fr")
	h.Set("Content-Location", "/payments/7.gz")
	h.Set("Content-Disposition", "attachment")
	h.Set("Digest", "sha-256=abc")
	h.Set("Content-Digest", "sha-256=:abc:")
	h.Set("Retry-After", "3")
	Write(rec, Problem{Status: 503})
	res := rec.Result()
	for _, name := range []string{"Content-Encoding", "Content-Length", "Content-Range", "ETag", "Last-Modified",
		"Content-Language", "Content-Location", "Content-Disposition", "Digest", "Content-Digest"} {
		if v := res.Header.Get(name); v != "" {
			t.Errorf("%s: %q kept on the problem body", name, v)
		}
	}
	if got := res.Header.Get("X-Content-Type-Options"); got != "nosniff" {
		t.Errorf("X-Content-Type-Options = %q, want nosniff", got)
	}
	if got := res.Header.Get("Retry-After"); got != "3" {
		t.Errorf("Retry-After = %q, the caller's header lost", got)
	}
	var p Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Status != 503 {
		t.Errorf("body %q: %v", rec.Body.String(), err)
	}
}
