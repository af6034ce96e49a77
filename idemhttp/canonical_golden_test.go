package idemhttp

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestCanonicalJSONGolden checks that CanonicalJSON gives exactly what the
// original implementation (oldCanonicalJSON, canonical_old_test.go) gives:
// the same bytes, or the same error, for the fuzz corpus and seeds, the
// inputs of the other canonical tests, and generated documents with their
// mutations. Stored fingerprints depend on these bytes.
func TestCanonicalJSONGolden(t *testing.T) {
	t.Parallel()
	inputs := goldenInputs(t)
	var ok, failed int
	for _, in := range inputs {
		want, wantErr := oldCanonicalJSON(in)
		got, err := CanonicalJSON(in)
		if wantErr == nil {
			ok++
		} else {
			failed++
		}
		switch {
		case (err == nil) != (wantErr == nil):
			t.Fatalf("CanonicalJSON(%q): error %v, original %v", trim(in), err, wantErr)
		case err != nil && (err.Error() != wantErr.Error() || !errors.Is(err, ErrInvalidJSON) || got != nil):
			t.Fatalf("CanonicalJSON(%q): error %q, original %q", trim(in), err, wantErr)
		case !bytes.Equal(got, want) || (got == nil) != (want == nil):
			t.Fatalf("CanonicalJSON(%q)\n got  %q\n want %q", trim(in), trim(got), trim(want))
		}
	}
	t.Logf("%d inputs: %d canonicalised, %d rejected", len(inputs), ok, failed)
	if ok < 1000 || failed < 1000 {
		t.Fatalf("too few inputs of a kind: %d canonicalised, %d rejected", ok, failed)
	}
}

func trim(b []byte) []byte {
	if len(b) > 300 {
		return b[:300]
	}
	return b
}

// goldenInputs returns every input the golden comparison covers.
func goldenInputs(t *testing.T) [][]byte {
	var ins [][]byte
	add := func(s string) { ins = append(ins, []byte(s)) }
	// FuzzCanonicalJSON's seeds.
	for _, s := range []string{
		`null`, `{"b":1,"a":[1,2.5e-3,"x"]}`, `"\ud83d\ude00"`, `"\ud800"`, `{"a":1,"a":2}`,
		`[[[[]]]]`, `{"\u20ac":1,"\ufb33":2,"😀":3}`, "\"\xff\"", `-0.0E+10`, `"\u0000<>&\u2028"`,
		` { "x" : { } } `, `[1,]`, `{} x`, `"\/"`,
	} {
		add(s)
	}
	// The fuzz corpus, when there is one.
	files, err := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzCanonicalJSON", "*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		ins = append(ins, readCorpusFile(t, f)...)
	}
	// The inputs of the other canonical tests.
	for _, s := range []string{
		`null`, `true`, `false`, `{ }`, "[\n]", " \t\r\n{ \"a\" : [ 1 , 2 ] }\n", `{"b":1,"a":2,"c":3}`,
		`{"z":{"y":1,"x":[{"b":0,"a":0}]},"a":null}`, `[3,1,2]`, `{"ab":1,"a":2,"":3}`,
		`{"\u20ac":1,"\r":2,"\ufb33":3,"1":4,"\ud83d\ude00":5,"\u0080":6,"\u00f6":7}`,
		"{\"\ue000\":1,\"\U0001F600\":2}", "{\"\U0001F601\":1,\"\U0001F600\":2}",
		`[1,1.0,1e0,1E+0,-0,0.10,12345678901234567890123,1e-7]`, `"\u0041\u00e9"`, `"\ud83d\ude00"`,
		`"\u00E9"`, `"a\/b"`, `"\"\\\b\f\n\r\t"`, `"\u001F\u0000\u007f"`, `"<a&b>\u003c"`, `"\u2028\u2029"`,
		"\"\uFFFD\"", `{"\u0062":1,"a":2}`, `{"a":1,"A":2}`,
		`{"a":1,"b":[true,null]}`, `{"b":[true,null],"a":1}`, " {\n  \"b\" : [ true , null ] ,\n  \"a\" : 1\n}\n",
		`{"\u0061":1,"b":[true,null]}`, `"A/é"`, `"\u0041\/\u00e9"`, `"\u0041\u002F\u00E9"`, `"😀"`, `"\uD83D\uDE00"`,
		`1`, `1.0`, `0`, `-0`, `100`, `1e2`, `[1,2]`, `[2,1]`, `{"a":1}`, `{"A":1}`, `{"a":"1"}`, `"\ufffd"`,
		`"\u00e9"`, `"null"`, `{}`, `[]`,
		``, " \n", `{} {}`, `1x`, `[1,]`, `{"a":1,}`, `[1 2]`, `{"a" 1}`, `{a:1}`, `{1:1}`, `'a'`, `[1`,
		`{"a":1`, `"abc`, `[}`, `nul`, `True`, `[truex]`, "\uFEFF{}", `NaN`, `+1`, `01`, `-01`, `-`, `1.`,
		`.5`, `1e`, `1e+`, `0x10`, `{"a":1,"a":1}`, `{"a":1,"\u0061":2}`, `[{"b":{"x":1,"y":2,"x":3}}]`,
		"\"a\xffb\"", "{\"\xc3\":1}", "\"\xe2\x82\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "[1,\xff]",
		`"\ud800"`, `"a\ud800`, `"\ud800x"`, `"\ud800\n"`, `"\ud800\ud800"`, `"\udc00"`, `"\ude00\ud83d"`,
		`"\u12"`, `"\u12g4"`, `"\u+123"`, `"\x41"`, `"\`, "\"a\x01\"", "\"a\nb\"", "\"a\tb\"", `{} // x`,
		`{"amount":"10.00","currency":"EUR"}`, `{"currency":"EUR","amount":"10.00"}`,
		`{"\u0061mount":"10.00","currency":"\u0045UR"}`, `{"a":1, "a":2}`, "[\"\xff\"]",
		`{"b":1, "a":2}`, `{"a":1,"b":2`, `{"b":2,"a":1`,
		// Edge cases of the parser.
		`"\u`, `"\u123`, `"\ud83d\u`, `"\ud83d\ude0`, `"\ud83d\\`, `"\ud83d\`, `"\ud83d"`, `{"a"`, `{"a":`,
		`{"a":1 `, `{"a":1,`, `[`, `[1,`, `-0.`, `-0e`, `0e-`, `1E-0`, `-`, `--1`, `[-]`, `{"":0,"":0}`,
		`{"\u0000":1,"\u0001":2,"":3}`, "{\"\U0010FFFF\":1,\"\uFFFF\":2,\"\U00010000\":3,\"\uE000\":4}",
		`tru`, `fals`, `nulll`, `[null,true,false]`, "\t", "\x00", "\"\x7f\"",
	} {
		add(s)
	}
	// Nesting at and over the limit, and large reordered documents.
	nest := func(open, close string, n int) string {
		return strings.Repeat(open, n) + "0" + strings.Repeat(close, n)
	}
	add(nest("[", "]", maxJSONDepth))
	add(nest(`{"a":`, "}", maxJSONDepth))
	add(nest(`[{"a":`, "}]", maxJSONDepth/2))
	add(nest("[", "]", maxJSONDepth+1))
	add(nest(`{"a":`, "}", maxJSONDepth+1))
	add(strings.Repeat("[", 100_000))
	add(strings.Repeat(`{"":`, 100_000))
	add(strings.Repeat(`{"b":`, 500) + `"` + strings.Repeat("x", 1<<10) + `"` + strings.Repeat(`,"a":0}`, 500))
	add(string(benchPayment))
	add(string(benchOrder))
	add(string(benchLarge))
	// Generated documents and their mutations.
	r := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		doc := genJSON(r, 0)
		add(doc)
		ins = append(ins, mutations(r, []byte(doc))...)
	}
	for range 1000 {
		ins = append(ins, randomTokens(r))
	}
	return ins
}

// readCorpusFile reads a "go test fuzz v1" file of one []byte argument.
func readCorpusFile(t *testing.T, name string) [][]byte {
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "[]byte(") || !strings.HasSuffix(line, ")") {
			continue
		}
		s, err := strconv.Unquote(line[len("[]byte(") : len(line)-1])
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out = append(out, []byte(s))
	}
	return out
}

var (
	genSpaces  = []string{"", "", "", " ", "\n", "\t", "\r\n  "}
	genNumbers = []string{
		"0", "-0", "1", "1.0", "1e2", "1E+2", "1e-2", "-1.5e-3", "100", "12345678901234567890123",
		"0.10", "1e0", "-0.0E+10", "3.14159", "9007199254740993", "1e400", "-1e-400", "42", "100.50",
		"0.000001", "1E0", "-12", "7e+07",
	}
	genPieces = []string{
		"a", "b", "xyz", "Hello, world", " ", "0", `\u0041`, `\u00e9`, "é", "€", `\u20AC`, `\u20ac`,
		"😀", `\ud83d\ude00`, `\uD83D\uDE00`, "\ue000", `\ue000`, "\ufb33", `\uFB33`, `\/`, "/", `\n`,
		`\b`, `\f`, `\t`, `\r`, `\"`, `\\`, `\u001f`, `\u001F`, `\u0000`, `\u0008`, `\u000a`, "\x7f",
		`\u007f`, "<>&", `\u003c`, "\u2028", `\u2028`, "\uFFFD", `\ufffd`, "\U0001F601", "\U00010000",
		"\U0010FFFF", `\udbff\udfff`, `\ud800\udc00`, `\u0080`, "\u0080", "ö", "\uffff", `\uffff`,
	}
	genKeyPieces = []string{
		"a", "b", "A", "ab", `\u0061`, "ö", `\u00F6`, "€", "😀", "\ue000", "\ufb33", "\U0001F600", "",
		"1", `\r`, "key", "id", "amount", `\ud83d\ude00`, "\uffff", "\U00010000", "z", "_", `\u0000`,
	}
)

func pick(r *rand.Rand, s []string) string { return s[r.IntN(len(s))] }

func genString(r *rand.Rand, pieces []string, max int) string {
	var b strings.Builder
	b.WriteByte('"')
	for range r.IntN(max + 1) {
		b.WriteString(pick(r, pieces))
	}
	b.WriteByte('"')
	return b.String()
}

// genJSON returns a random JSON document, valid except for the duplicate
// keys its small key space produces now and then.
func genJSON(r *rand.Rand, depth int) string {
	sp := func() string { return pick(r, genSpaces) }
	k := r.IntN(10)
	if depth >= 5 {
		k = 2 + r.IntN(8)
	}
	switch k {
	case 0: // object
		var b strings.Builder
		b.WriteString("{" + sp())
		n := r.IntN(7)
		for i := range n {
			if i > 0 {
				b.WriteString("," + sp())
			}
			b.WriteString(genString(r, genKeyPieces, 2) + sp() + ":" + sp() + genJSON(r, depth+1) + sp())
		}
		b.WriteString("}")
		return b.String()
	case 1: // array
		var b strings.Builder
		b.WriteString("[" + sp())
		for i := range r.IntN(7) {
			if i > 0 {
				b.WriteString("," + sp())
			}
			b.WriteString(genJSON(r, depth+1) + sp())
		}
		b.WriteString("]")
		return b.String()
	case 2, 3, 4:
		return genString(r, genPieces, 6)
	case 5, 6:
		return pick(r, genNumbers)
	case 7:
		return strconv.FormatInt(r.Int64N(1<<53)-1<<52, 10)
	default:
		return pick(r, []string{"true", "false", "null"})
	}
}

// mutations returns broken variants of doc: truncated, with a byte
// replaced, with a byte inserted.
func mutations(r *rand.Rand, doc []byte) [][]byte {
	const alphabet = "{}[]:,\"\\ u0x-.eE+9t\xff\x01\n"
	var out [][]byte
	if len(doc) > 1 {
		out = append(out, doc[:r.IntN(len(doc))])
		m := bytes.Clone(doc)
		m[r.IntN(len(m))] = alphabet[r.IntN(len(alphabet))]
		out = append(out, m)
	}
	i := r.IntN(len(doc) + 1)
	ins := append(bytes.Clone(doc[:i]), alphabet[r.IntN(len(alphabet))])
	out = append(out, append(ins, doc[i:]...))
	return out
}

// randomTokens returns a short sequence of JSON tokens, mostly invalid.
func randomTokens(r *rand.Rand) []byte {
	toks := []string{"{", "}", "[", "]", ":", ",", `"a"`, `"\u00e9"`, "1", "-0", "1e2", "true", "null", " ", `"`, `\`}
	var b []byte
	for range 1 + r.IntN(12) {
		b = append(b, pick(r, toks)...)
	}
	return b
}

// FuzzCanonicalJSONGolden compares CanonicalJSON with the original
// implementation on fuzzed input.
func FuzzCanonicalJSONGolden(f *testing.F) {
	for _, s := range []string{
		`null`, `{"b":1,"a":[1,2.5e-3,"x"]}`, `"\ud83d\ude00"`, `"\ud800"`, `{"a":1,"a":2}`,
		`{"\u20ac":1,"\ufb33":2,"😀":3}`, "\"\xff\"", `-0.0E+10`, `"\u0000<>&\u2028"`, ` { "x" : { } } `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		want, wantErr := oldCanonicalJSON(in)
		got, err := CanonicalJSON(in)
		if (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) || !bytes.Equal(got, want) || (got == nil) != (want == nil) {
			t.Fatalf("CanonicalJSON(%q) = %q, %v; original %q, %v", in, got, err, want, wantErr)
		}
	})
}
