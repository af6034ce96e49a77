package idemhttp

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"math/rand/v2"
	"mime"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"testing"
)

// The original implementations of the functions optimised on the request
// path, kept as references for the equivalence tests below.

func oldFingerprint(method, route, contentType string, body []byte) [32]byte {
	mode := byte(bodyRaw)
	if oldIsJSON(contentType) {
		if c, err := oldCanonicalJSON(body); err == nil {
			mode, body = bodyCanonicalJSON, c
		}
	}
	h := sha256.New()
	h.Write([]byte{fingerprintVersion})
	oldWriteField(h, []byte(method))
	oldWriteField(h, []byte(route))
	h.Write([]byte{mode})
	oldWriteField(h, body)
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}

func oldWriteField(h hash.Hash, b []byte) {
	h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(b))))
	h.Write(b)
}

func oldIsJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || (strings.HasSuffix(mt, "+json") && strings.Contains(mt, "/"))
}

func oldEncodeHeaders(h http.Header, allow []string) ([]byte, error) {
	kept := make(map[string][]string)
	for _, name := range allow {
		if v := h.Values(name); len(v) > 0 {
			kept[name] = v
		}
	}
	return json.Marshal(kept)
}

func oldDecodeHeaders(b []byte, h http.Header) error {
	if len(b) == 0 {
		return nil
	}
	var kept map[string][]string
	if err := json.Unmarshal(b, &kept); err != nil {
		return err
	}
	for k, vs := range kept {
		for _, v := range vs {
			h.Add(k, v)
		}
	}
	return nil
}

func oldParseKey(h http.Header) (string, error) {
	vs := h.Values(KeyHeader)
	switch {
	case len(vs) == 0:
		return "", ErrKeyMissing
	case len(vs) > 1:
		return "", fmt.Errorf("%w (%d headers)", ErrKeyMultiple, len(vs))
	}
	v := strings.Trim(vs[0], " \t")
	key := v
	if strings.HasPrefix(v, `"`) {
		var err error
		if key, err = oldUnquote(v); err != nil {
			return "", err
		}
	} else if i := strings.IndexByte(v, '"'); i >= 0 {
		return "", fmt.Errorf("%w: quote at offset %d of an unquoted key", ErrKeyMalformed, i)
	}
	switch {
	case key == "":
		return "", fmt.Errorf("%w: empty key", ErrKeyMalformed)
	case len(key) > MaxKeyLen:
		return "", fmt.Errorf("%w: key longer than %d characters", ErrKeyMalformed, MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return "", fmt.Errorf("%w: byte 0x%02x at offset %d is not visible ASCII", ErrKeyMalformed, c, i)
		}
	}
	return key, nil
}

func oldUnquote(s string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			i++
			if i == len(s) || (s[i] != '"' && s[i] != '\\') {
				return "", fmt.Errorf("%w: bad escape at offset %d", ErrKeyMalformed, i-1)
			}
			b.WriteByte(s[i])
		case c == '"':
			if i != len(s)-1 {
				return "", fmt.Errorf("%w: data after closing quote at offset %d", ErrKeyMalformed, i)
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("%w: byte 0x%02x at offset %d is not printable ASCII", ErrKeyMalformed, c, i)
		default:
			b.WriteByte(c)
		}
	}
	return "", fmt.Errorf("%w: missing closing quote", ErrKeyMalformed)
}

var equivContentTypes = []string{
	"application/json", "application/json; charset=utf-8", "application/json;charset=utf-8",
	"application/json; charset=UTF-8", "application/json;charset=UTF-8", "Application/JSON",
	"application/problem+json", "application/json; =", "text/plain", "", "+json", "application/jsonl",
	"application/json ; charset=utf-8", " application/json", "application/json;", "application/json; charset=\"utf-8\"",
}

// TestFingerprintEquivalent checks Fingerprint against the original
// implementation on every golden input and content type.
func TestFingerprintEquivalent(t *testing.T) {
	t.Parallel()
	for _, ct := range equivContentTypes {
		if isJSON(ct) != oldIsJSON(ct) {
			t.Errorf("isJSON(%q) = %v, original %v", ct, isJSON(ct), oldIsJSON(ct))
		}
	}
	for i, in := range goldenInputs(t) {
		ct := equivContentTypes[i%len(equivContentTypes)]
		if i%3 == 0 {
			ct = "application/json"
		}
		route := "/payments/" + fmt.Sprint(i%7)
		if got, want := Fingerprint("POST", route, ct, in), oldFingerprint("POST", route, ct, in); got != want {
			t.Fatalf("Fingerprint(%q, %q) = %x, original %x", ct, trim(in), got, want)
		}
	}
}

// randomHeaderValue returns a header value of awkward bytes: HTML
// characters, controls, invalid UTF-8, U+2028, escapes.
func randomHeaderValue(r *rand.Rand) string {
	pieces := []string{"a", "Z", " ", "application/json", "<", ">", "&", `"`, `\`, "\x00", "\x1f", "\t", "\n",
		"\b", "\f", "\r", "\x7f", "é", "😀", "\u2028", "\u2029", "\xff", "\xe2\x82", "\ufffd", "/x/y?z=1", "\ud7ff"}
	var b strings.Builder
	for range r.IntN(6) {
		b.WriteString(pieces[r.IntN(len(pieces))])
	}
	return b.String()
}

func TestHeadersEquivalent(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 4))
	names := []string{"Content-Type", "Location", "Cache-Control", "Set-Cookie", "X-Custom", "Content-Language", "content-type", "X-É"}
	for n := range 3000 {
		h := make(http.Header)
		for range r.IntN(5) {
			name := names[r.IntN(len(names))]
			for range 1 + r.IntN(3) {
				h.Add(name, randomHeaderValue(r))
			}
		}
		allow := Config{}.withDefaults().replayHeaders()
		if n%2 == 0 {
			allow = append(allow, names[r.IntN(len(names))], names[r.IntN(len(names))])
		}
		got, err := encodeHeaders(h, allow)
		want, wantErr := oldEncodeHeaders(h, allow)
		if err != nil || wantErr != nil || string(got) != string(want) {
			t.Fatalf("encodeHeaders(%q, %q) = %s, %v; original %s, %v", h, allow, got, err, want, wantErr)
		}
		checkDecode(t, got)
	}
	for _, s := range []string{
		``, `{}`, `null`, `{"A":["b"]}`, `{ "A" : [ "b" ] }`, `{"A":["b"],"A":["c"]}`, `{"A":[]}`, `{"A":null}`,
		`{"a":["x","y"],"A":["z"]}`, `{"A":["\u003c\ufffd"]}`, `{"A":["b"]} `, `{"A":["b"]}}`, `{"A":["b"],}`,
		`{"A":["b",]}`, `{"A":["b"`, `{"A":"b"}`, `{"A":[1]}`, `[]`, `{"A":["b"],"B":["c","d"],"C":["é"]}`,
		"{\"A\":[\"\xff\"]}", "{\"A\":[\"\x01\"]}", `{"content-type":["x"]}`, `{"":["x"]}`, `{"A":["b"]`,
		`{,}`, `{"A":["b"],"B"}`, `{"A":["b"]"B":["c"]}`, `{"A":["b""c"]}`, `{"A":["b"],"":[""]}`, `{"A" :["b"]}`,
	} {
		checkDecode(t, []byte(s))
	}
}

// checkDecode compares decodeHeaders with the original on b, into a header
// that already has a value: the stored names replace what the header had
// (as the executed response did), and names not stored are kept.
func checkDecode(t *testing.T, b []byte) {
	t.Helper()
	got, want := http.Header{"A": {"0"}}, http.Header{"A": {"0"}}
	err := decodeHeaders(b, got)
	var stored map[string][]string
	if json.Unmarshal(b, &stored) == nil {
		for name := range stored {
			delete(want, textproto.CanonicalMIMEHeaderKey(name))
		}
	}
	wantErr := oldDecodeHeaders(b, want)
	if (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
		t.Fatalf("decodeHeaders(%q): error %v, original %v", b, err, wantErr)
	}
	// The original adds names in map order: only values under one
	// canonical name from two spellings may come in another order.
	norm := func(h http.Header) http.Header {
		for _, vs := range h {
			slices.Sort(vs)
		}
		return h
	}
	if err == nil && fmt.Sprint(norm(got)) != fmt.Sprint(norm(want)) {
		t.Fatalf("decodeHeaders(%q) = %q, original %q", b, got, want)
	}
}

func TestParseKeyEquivalent(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(5, 6))
	pieces := []string{"a", "Z", "-", `"`, `\`, " ", "\t", "\x00", "\x7f", "é", "0", "~", "!"}
	for range 20000 {
		var b strings.Builder
		for range r.IntN(10) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		h := http.Header{KeyHeader: {b.String()}}
		got, err := ParseKey(h)
		want, wantErr := oldParseKey(h)
		if got != want || (err == nil) != (wantErr == nil) || (err != nil && (err.Error() != wantErr.Error() || !errors.Is(err, ErrKeyMalformed))) {
			t.Fatalf("ParseKey(%q) = %q, %v; original %q, %v", b.String(), got, err, want, wantErr)
		}
	}
}
