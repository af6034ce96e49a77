package idemhttp

import (
	"net/http"
	"strings"
	"testing"
)

// TestEncodeTrailers pins what is stored for a response with trailers: the
// allowed headers as without them, and each allowed trailer under
// http.TrailerPrefix and its name; storedTrailers reports them.
func TestEncodeTrailers(t *testing.T) {
	t.Parallel()
	allow := Config{ReplayHeaders: []string{"X-Sum", "X-Digest", "If-Match"}}.withDefaults().replayHeaders()
	for _, c := range []struct {
		name  string
		h     http.Header
		allow []string
		want  string
	}{
		{"declared", http.Header{"Content-Type": {"text/plain"}, "Trailer": {"X-Sum"}, "X-Sum": {"1"}}, allow,
			`{"Content-Type":["text/plain"],"Trailer:X-Sum":["1"],"X-Sum":["1"]}`},
		{"declared lower case, twice, with others", http.Header{"Trailer": {" x-sum , X-Other", "X-Digest"},
			"X-Sum": {"1"}, "X-Other": {"o"}, "X-Digest": {"d"}}, allow,
			`{"Trailer:X-Digest":["d"],"Trailer:X-Sum":["1"],"X-Digest":["d"],"X-Sum":["1"]}`},
		{"declared without a value", http.Header{"Trailer": {"X-Sum"}}, allow, `{}`},
		{"declared but forbidden in a trailer", http.Header{"Trailer": {"Content-Type, If-Match"},
			"Content-Type": {"a/b"}, "If-Match": {"x"}}, allow, `{"Content-Type":["a/b"],"If-Match":["x"]}`},
		{"prefixed", http.Header{http.TrailerPrefix + "X-Digest": {"d1", "d2"}, http.TrailerPrefix + "X-Other": {"o"}}, allow,
			`{"Trailer:X-Digest":["d1","d2"]}`},
		{"prefixed as written", http.Header{http.TrailerPrefix + "x-digest": {"d"}}, allow, `{"Trailer:x-digest":["d"]}`},
		{"prefixed and declared: net/http sends both", http.Header{http.TrailerPrefix + "X-Sum": {"p"}, "Trailer": {"X-Sum"},
			"X-Sum": {"1"}}, allow, `{"Trailer:X-Sum":["p","1"],"X-Sum":["1"]}`},
		{"declaration stored: declared ones are not stored again",
			http.Header{"Trailer": {"X-Sum"}, "X-Sum": {"1"}, http.TrailerPrefix + "X-Digest": {"d"}},
			append(allow[:len(allow):len(allow)], "Trailer"),
			`{"Trailer":["X-Sum"],"Trailer:X-Digest":["d"],"X-Sum":["1"]}`},
		{"no allowed trailer: as without trailers", http.Header{"Location": {"/a"}, "Trailer": {"X-Other"}, "X-Other": {"o"},
			http.TrailerPrefix + "X-Secret": {"s"}}, allow, `{"Location":["/a"]}`},
	} {
		got, err := encodeHeaders(c.h, c.allow)
		if err != nil || string(got) != c.want {
			t.Errorf("%s: encodeHeaders = %s, %v; want %s", c.name, got, err, c.want)
		}
		// No value in these cases starts with "Trailer".
		if want := strings.Contains(c.want, `"Trailer`); storedTrailers(got) != want {
			t.Errorf("%s: storedTrailers(%s) = %v, want %v", c.name, got, !want, want)
		}
	}
}
