package idemhttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCanonicalJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, want string
	}{
		{"null", `null`, `null`},
		{"true", `true`, `true`},
		{"false", `false`, `false`},
		{"empty object", `{ }`, `{}`},
		{"empty array", "[\n]", `[]`},
		{"whitespace removed", " \t\r\n{ \"a\" : [ 1 , 2 ] }\n", `{"a":[1,2]}`},
		{"keys sorted", `{"b":1,"a":2,"c":3}`, `{"a":2,"b":1,"c":3}`},
		{"nested keys sorted", `{"z":{"y":1,"x":[{"b":0,"a":0}]},"a":null}`, `{"a":null,"z":{"x":[{"a":0,"b":0}],"y":1}}`},
		{"arrays keep order", `[3,1,2]`, `[3,1,2]`},
		{"prefix keys", `{"ab":1,"a":2,"":3}`, `{"":3,"a":2,"ab":1}`},
		{
			// RFC 8785 section 3.2.3.
			"UTF-16 key order",
			`{"\u20ac":1,"\r":2,"\ufb33":3,"1":4,"\ud83d\ude00":5,"\u0080":6,"\u00f6":7}`,
			"{\"\\r\":2,\"1\":4,\"\u0080\":6,\"ö\":7,\"€\":1,\"😀\":5,\"\ufb33\":3}",
		},
		{"supplementary before U+E000", "{\"\ue000\":1,\"\U0001F600\":2}", "{\"\U0001F600\":2,\"\ue000\":1}"},
		{"same high surrogate", "{\"\U0001F601\":1,\"\U0001F600\":2}", "{\"\U0001F600\":2,\"\U0001F601\":1}"},
		{"numbers verbatim", `[1,1.0,1e0,1E+0,-0,0.10,12345678901234567890123,1e-7]`, `[1,1.0,1e0,1E+0,-0,0.10,12345678901234567890123,1e-7]`},
		{"unicode escape decoded", `"\u0041\u00e9"`, `"Aé"`},
		{"surrogate pair decoded", `"\ud83d\ude00"`, `"😀"`},
		{"upper-case hex escape", `"\u00E9"`, `"é"`},
		{"solidus unescaped", `"a\/b"`, `"a/b"`},
		{"short escapes", `"\"\\\b\f\n\r\t"`, `"\"\\\b\f\n\r\t"`},
		{"control escaped lower-case", `"\u001F\u0000\u007f"`, "\"\\u001f\\u0000\x7f\""},
		{"no HTML escaping", `"<a&b>\u003c"`, `"<a&b><"`},
		{"line separators literal", `"\u2028\u2029"`, "\"\u2028\u2029\""},
		{"U+FFFD literal kept", "\"\uFFFD\"", "\"\uFFFD\""},
		{"escaped key", `{"\u0062":1,"a":2}`, `{"a":2,"b":1}`},
		{"keys differing only in case", `{"a":1,"A":2}`, `{"A":2,"a":1}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := CanonicalJSON([]byte(tt.in))
			if err != nil {
				t.Fatalf("CanonicalJSON(%s): %v", tt.in, err)
			}
			if string(got) != tt.want {
				t.Errorf("CanonicalJSON(%s)\n got  %s\n want %s", tt.in, got, tt.want)
			}
			checkCanonical(t, []byte(tt.in), got)
		})
	}
}

func TestCanonicalJSONEquivalent(t *testing.T) {
	t.Parallel()
	groups := [][]string{
		{`{"a":1,"b":[true,null]}`, `{"b":[true,null],"a":1}`, " {\n  \"b\" : [ true , null ] ,\n  \"a\" : 1\n}\n", `{"\u0061":1,"b":[true,null]}`},
		{`"A/é"`, `"\u0041\/\u00e9"`, `"\u0041\u002F\u00E9"`},
		{`"😀"`, `"\ud83d\ude00"`, `"\uD83D\uDE00"`},
	}
	for _, g := range groups {
		want, err := CanonicalJSON([]byte(g[0]))
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range g[1:] {
			got, err := CanonicalJSON([]byte(in))
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("CanonicalJSON(%s) = %s, %v; want %s like %s", in, got, err, want, g[0])
			}
		}
	}
}

func TestCanonicalJSONDifferent(t *testing.T) {
	t.Parallel()
	pairs := [][2]string{
		{`1`, `1.0`},
		{`0`, `-0`},
		{`100`, `1e2`},
		{`[1,2]`, `[2,1]`},
		{`{"a":1}`, `{"A":1}`},
		{`{"a":1}`, `{"a":"1"}`},
		{`"\ufffd"`, `"\u00e9"`},
		{`null`, `"null"`},
		{`{}`, `[]`},
	}
	for _, p := range pairs {
		a, errA := CanonicalJSON([]byte(p[0]))
		b, errB := CanonicalJSON([]byte(p[1]))
		if errA != nil || errB != nil {
			t.Fatalf("errors %v, %v", errA, errB)
		}
		if bytes.Equal(a, b) {
			t.Errorf("%s and %s both canonicalise to %s", p[0], p[1], a)
		}
	}
}

func TestCanonicalJSONInvalid(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, in string }{
		{"empty", ``},
		{"only whitespace", " \n"},
		{"trailing data", `{} {}`},
		{"trailing garbage", `1x`},
		{"trailing comma in array", `[1,]`},
		{"trailing comma in object", `{"a":1,}`},
		{"missing comma", `[1 2]`},
		{"missing colon", `{"a" 1}`},
		{"unquoted key", `{a:1}`},
		{"number key", `{1:1}`},
		{"single quotes", `'a'`},
		{"unterminated array", `[1`},
		{"unterminated object", `{"a":1`},
		{"unterminated string", `"abc`},
		{"mismatched brackets", `[}`},
		{"bare word", `nul`},
		{"capitalised literal", `True`},
		{"literal with suffix", `[truex]`},
		{"BOM", "\uFEFF{}"},
		{"NaN", `NaN`},
		{"leading plus", `+1`},
		{"leading zero", `01`},
		{"negative leading zero", `-01`},
		{"lone minus", `-`},
		{"dot without digits", `1.`},
		{"leading dot", `.5`},
		{"exponent without digits", `1e`},
		{"exponent sign only", `1e+`},
		{"hex number", `0x10`},
		{"duplicate key", `{"a":1,"a":1}`},
		{"duplicate key after escape", `{"a":1,"\u0061":2}`},
		{"nested duplicate key", `[{"b":{"x":1,"y":2,"x":3}}]`},
		{"invalid UTF-8 in string", "\"a\xffb\""},
		{"invalid UTF-8 in key", "{\"\xc3\":1}"},
		{"truncated UTF-8", "\"\xe2\x82\""},
		{"overlong UTF-8", "\"\xc0\xaf\""},
		{"UTF-8 encoded surrogate", "\"\xed\xa0\x80\""},
		{"invalid UTF-8 outside string", "[1,\xff]"},
		{"lone high surrogate", `"\ud800"`},
		{"lone high surrogate at end", `"a\ud800`},
		{"high surrogate then char", `"\ud800x"`},
		{"high surrogate then escape", `"\ud800\n"`},
		{"two high surrogates", `"\ud800\ud800"`},
		{"lone low surrogate", `"\udc00"`},
		{"reversed pair", `"\ude00\ud83d"`},
		{"short unicode escape", `"\u12"`},
		{"non-hex unicode escape", `"\u12g4"`},
		{"plus in unicode escape", `"\u+123"`},
		{"invalid escape", `"\x41"`},
		{"escape at end", `"\`},
		{"raw control char", "\"a\x01\""},
		{"raw newline", "\"a\nb\""},
		{"raw tab", "\"a\tb\""},
		{"comment", `{} // x`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := CanonicalJSON([]byte(tt.in))
			if !errors.Is(err, ErrInvalidJSON) {
				t.Fatalf("CanonicalJSON(%q) = %s, %v; want ErrInvalidJSON", tt.in, got, err)
			}
			if got != nil {
				t.Errorf("output %q with error", got)
			}
		})
	}
}

func TestCanonicalJSONDepth(t *testing.T) {
	t.Parallel()
	nest := func(open, close string, n int) []byte {
		return []byte(strings.Repeat(open, n) + "0" + strings.Repeat(close, n))
	}
	tests := []struct {
		name string
		in   []byte
		ok   bool
	}{
		{"arrays at the limit", nest("[", "]", maxJSONDepth), true},
		{"objects at the limit", nest(`{"a":`, "}", maxJSONDepth), true},
		{"mixed at the limit", nest(`[{"a":`, "}]", maxJSONDepth/2), true},
		{"arrays over the limit", nest("[", "]", maxJSONDepth+1), false},
		{"objects over the limit", nest(`{"a":`, "}", maxJSONDepth+1), false},
		{"hostile unterminated", []byte(strings.Repeat("[", 10_000_000)), false},
		{"hostile objects", []byte(strings.Repeat(`{"":`, 1_000_000)), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := CanonicalJSON(tt.in)
			if tt.ok {
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, tt.in) {
					t.Error("already canonical input changed")
				}
				return
			}
			if !errors.Is(err, ErrInvalidJSON) {
				t.Fatalf("err = %v, want ErrInvalidJSON", err)
			}
		})
	}
}

// TestCanonicalJSONLargeReorder checks that deep nesting with objects that
// need reordering at every level stays fast (no quadratic copying).
func TestCanonicalJSONLargeReorder(t *testing.T) {
	t.Parallel()
	const depth = 5000
	big := `"` + strings.Repeat("x", 1<<20) + `"`
	in := strings.Repeat(`{"b":`, depth) + big + strings.Repeat(`,"a":0}`, depth)
	out, err := CanonicalJSON([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(in) || !bytes.HasPrefix(out, []byte(`{"a":0,"b":{"a":0,`)) {
		t.Errorf("unexpected output prefix %.40s", out)
	}
	checkCanonical(t, []byte(in), out)
}

// checkCanonical asserts the properties every successful canonicalisation
// has: the output is valid JSON, a fixed point, and the same JSON value as
// the input.
func checkCanonical(t *testing.T, in, out []byte) {
	t.Helper()
	if !json.Valid(out) || !utf8.Valid(out) {
		t.Fatalf("output is not valid JSON: %q", out)
	}
	again, err := CanonicalJSON(out)
	if err != nil {
		t.Fatalf("canonicalising the output %q: %v", out, err)
	}
	if !bytes.Equal(again, out) {
		t.Fatalf("not a fixed point:\n %q\n %q", out, again)
	}
	if !reflect.DeepEqual(decodeJSON(t, in), decodeJSON(t, out)) {
		t.Fatalf("value changed:\n in  %q\n out %q", in, out)
	}
}

func decodeJSON(t *testing.T, b []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("encoding/json cannot decode %q: %v", b, err)
	}
	return v
}

func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{
		`null`, `{"b":1,"a":[1,2.5e-3,"x"]}`, `"\ud83d\ude00"`, `"\ud800"`, `{"a":1,"a":2}`,
		`[[[[]]]]`, `{"\u20ac":1,"\ufb33":2,"😀":3}`, "\"\xff\"", `-0.0E+10`, `"\u0000<>&\u2028"`,
		` { "x" : { } } `, `[1,]`, `{} x`, `"\/"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := CanonicalJSON(in)
		if err != nil {
			if !errors.Is(err, ErrInvalidJSON) {
				t.Fatalf("error %v is not ErrInvalidJSON", err)
			}
			return
		}
		if !json.Valid(in) {
			t.Fatalf("accepted %q, which encoding/json rejects", in)
		}
		checkCanonical(t, in, out)
	})
}
