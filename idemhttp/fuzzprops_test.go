package idemhttp

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// fingerprintSeeds are bodies of the canonical and fingerprint tests.
var fingerprintSeeds = []string{
	`null`, `{"b":1,"a":[1,2.5e-3,"x"]}`, `"\ud83d\ude00"`, `{"\u20ac":1,"\ufb33":2,"😀":3}`, `-0.0E+10`,
	`"\u0000<>&\u2028"`, ` { "x" : { } } `, `"\/"`, `{"z":{"y":1,"x":[{"b":0,"a":0}]},"a":null}`,
	`{"\u20ac":1,"\r":2,"\ufb33":3,"1":4,"\ud83d\ude00":5,"\u0080":6,"\u00f6":7}`,
	"{\"\ue000\":1,\"\U0001F600\":2}", `[1,1.0,1e0,1E+0,-0,0.10,12345678901234567890123,1e-7]`,
	`"\"\\\b\f\n\r\t"`, `"\u001F\u0000\u007f"`, `{"a":1,"A":2}`, `{"\u0000":1,"\u0001":2,"":3}`,
	"{\"\U0010FFFF\":1,\"\uFFFF\":2,\"\U00010000\":3,\"\uE000\":4}", `{"amount":"10.00","currency":"EUR"}`,
	`{"\u0061mount":"10.00","currency":"\u0045UR"}`, `{"a":1,"a":2}`, `"\ud800"`, "\"\xff\"",
}

// FuzzFingerprintReencoded checks the promise of Fingerprint for JSON
// bodies: the same value sent with other key order, whitespace or string
// escaping (here, as encoding/json writes it again, with or without HTML
// escaping and indentation) has the same canonical form and fingerprint;
// and two bodies get the same fingerprint exactly when their canonical
// forms are equal.
func FuzzFingerprintReencoded(f *testing.F) {
	for i, s := range fingerprintSeeds {
		f.Add([]byte(s), []byte(fingerprintSeeds[(i+1)%len(fingerprintSeeds)]), i%2 == 0, i%3 == 0)
	}
	f.Fuzz(func(t *testing.T, in, other []byte, escapeHTML, indent bool) {
		const ct = "application/json"
		c, err := CanonicalJSON(in)
		if err != nil {
			return
		}
		d := json.NewDecoder(bytes.NewReader(in))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			t.Fatalf("CanonicalJSON accepted %q, which encoding/json cannot decode: %v", in, err)
		}
		var re bytes.Buffer
		e := json.NewEncoder(&re)
		e.SetEscapeHTML(escapeHTML)
		if indent {
			e.SetIndent(" ", "\t")
		}
		if err := e.Encode(v); err != nil {
			t.Fatalf("re-encoding %q: %v", in, err)
		}
		rc, err := CanonicalJSON(re.Bytes())
		if err != nil {
			t.Fatalf("CanonicalJSON(%q) = %q, but its re-encoding %q is rejected: %v", in, c, re.Bytes(), err)
		}
		if !bytes.Equal(rc, c) {
			t.Fatalf("same value, different canonical forms:\n %q -> %q\n %q -> %q", in, c, re.Bytes(), rc)
		}
		fp := Fingerprint("POST", "/r", ct, in)
		if got := Fingerprint("POST", "/r", ct, re.Bytes()); got != fp {
			t.Fatalf("same value, different fingerprints: %q and %q", in, re.Bytes())
		}
		if got := Fingerprint("POST", "/r", ct+"; charset=utf-8", c); got != fp {
			t.Fatalf("the canonical form %q of %q has another fingerprint", c, in)
		}
		if Fingerprint("POST", "/r", "text/plain", c) == fp {
			t.Fatalf("raw and canonical body %q have the same fingerprint", c)
		}
		oc, oerr := CanonicalJSON(other)
		same := Fingerprint("POST", "/r", ct, other) == fp
		if want := oerr == nil && bytes.Equal(oc, c); same != want {
			t.Fatalf("fingerprints of %q and %q equal: %v; canonical forms %q, %q (%v)", in, other, same, c, oc, oerr)
		}
	})
}

// headerNames are names a handler may set, in several spellings, among
// them trailers.
var headerNames = []string{"Content-Type", "content-type", "Location", "Set-Cookie", "X-Custom", "X-É", "",
	"Trailer", "Trailer:X-Custom", "Trailer:Content-Type", "X-Checksum", "Cache-Control", "Trailers"}

// FuzzHeaders checks how a response's headers are stored and replayed:
// encodeHeaders writes exactly what encoding/json writes for the allowed
// headers (json.Marshal before trailers were stored, so records stay
// readable both ways); decodeHeaders gives back what the handler set under
// the allowed names, each value as encoding/json would read it (invalid
// UTF-8 becomes U+FFFD) and replacing what the header had; and decoding
// arbitrary stored bytes agrees with encoding/json.
func FuzzHeaders(f *testing.F) {
	f.Add([]byte("\x00a\x01b\x02\x00"), "x-custom", []byte(`{"A":["b"],"B":["c","d"],"C":["é"]}`))
	f.Add([]byte("\x07checksum\x00\x06X-Checksum\x08abc\x07"), "X-Checksum", []byte(`{"A":["b"],"A":["c"]}`))
	f.Add([]byte("\x0b<&>\xff\u2028\x00\x03"), "trailer", []byte(`{"a":["x","y"],"A":["z"]}`))
	f.Add([]byte("\x01\x01\x02"), "", []byte(`{"A":["\u003c\ufffd"]}`))
	f.Add([]byte("\x09\x00\x00\x08X-Custom"), "Set-Cookie", []byte(`{ "A" : [ "b" ] }`))
	f.Fuzz(func(t *testing.T, spec []byte, extra string, stored []byte) {
		// spec: pairs of a name index and a value, the value up to the
		// next zero byte.
		h := make(http.Header)
		for len(spec) > 0 {
			name := headerNames[int(spec[0])%len(headerNames)]
			value, rest, _ := bytes.Cut(spec[1:], []byte{0})
			spec = rest
			if strings.HasPrefix(name, "Trailer:") {
				h[name] = append(h[name], string(value)) // as the handler sets it
			} else {
				h.Add(name, string(value))
			}
		}
		allow := Config{ReplayHeaders: []string{"X-Custom", "X-Checksum", "Trailer", extra}}.replayHeaders()
		got, err := encodeHeaders(h, allow)
		if err != nil {
			t.Fatalf("encodeHeaders(%q): %v", h, err)
		}
		if !hasTrailers(h) {
			want, _ := oldEncodeHeaders(h, allow)
			if !bytes.Equal(got, want) {
				t.Fatalf("encodeHeaders(%q, %q) = %s; json.Marshal gives %s", h, allow, got, want)
			}
		}
		replay := http.Header{"X-Custom": {"outer"}, "Vary": {"outer"}}
		if err := decodeHeaders(got, replay); err != nil {
			t.Fatalf("decodeHeaders(%s): %v", got, err)
		}
		checkDecode(t, got)
		if !hasTrailers(h) {
			for _, name := range allow {
				want := h.Values(name)
				if name == "" || len(want) == 0 {
					continue
				}
				want = slices.Clone(want)
				for i, v := range want {
					want[i] = jsonString(v)
				}
				// Two spellings of one name are stored as two members,
				// each with all the values: their replay repeats them.
				n := 0
				for _, a := range slices.Compact(slices.Sorted(slices.Values(allow))) {
					if http.CanonicalHeaderKey(a) == http.CanonicalHeaderKey(name) {
						n++
					}
				}
				gotVs := replay.Values(name)
				if len(gotVs) != n*len(want) || !slices.Equal(gotVs[:len(want)], want) {
					t.Fatalf("%s: handler set %q, stored %s, replayed %q", name, h.Values(name), got, gotVs)
				}
			}
			if vs := replay.Values("Vary"); len(vs) != 1 || vs[0] != "outer" {
				t.Fatalf("Vary, not stored, replayed as %q", vs)
			}
		}
		if !utf8.Valid(got) || !json.Valid(got) {
			t.Fatalf("stored headers %q are not valid JSON", got)
		}
		checkDecode(t, stored)
	})
}

// jsonString returns s as encoding/json reads it back once written: each
// byte of invalid UTF-8 becomes U+FFFD.
func jsonString(s string) string {
	var b strings.Builder
	for _, r := range s {
		b.WriteRune(r)
	}
	return b.String()
}
