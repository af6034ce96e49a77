// The ORIGINAL canonicaliser, kept verbatim (identifiers prefixed with old)
// as the reference the optimised CanonicalJSON must match byte for byte and
// error for error (TestCanonicalJSONGolden).

package idemhttp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// oldMaxJSONDepth bounds the nesting of arrays and objects, like encoding/json
// does, so that hostile input cannot grow the stack without limit.
const oldMaxJSONDepth = 10000

// oldCanonicalJSON returns the canonical form of the JSON document b: equal
// JSON values written with different object key order, insignificant
// whitespace or string escaping produce identical bytes.
//
// The canonical form has no whitespace; object members sorted by key,
// compared as UTF-16 code units as in RFC 8785 (JCS); arrays in their
// original order; strings written as UTF-8 with only `"`, `\` and control
// characters escaped (\b \f \n \r \t, otherwise \u00xx in lower case), so
// "\u0041" and "A" become the same string, and <, >, & are not escaped.
//
// Unlike RFC 8785, numbers keep their literal text: 1, 1.0 and 1e0 stay
// different, as do 0 and -0. A client retrying a request sends the same
// numbers, and reading them as float64 would merge distinct large integers
// or decimal amounts.
//
// oldCanonicalJSON rejects, with ErrInvalidJSON, what would make the canonical
// form ambiguous or lossy: invalid JSON, invalid UTF-8 and lone UTF-16
// surrogate escapes (which decoders silently replace with U+FFFD, so two
// different bodies would collide), duplicate object keys (decoders disagree
// on which one wins), data after the value, a byte order mark, and nesting
// deeper than 10000 arrays or objects.
func oldCanonicalJSON(b []byte) ([]byte, error) {
	p := oldJSONParser{in: b}
	p.skipSpace()
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos != len(b) {
		return nil, p.errorf("data after the JSON value")
	}
	return oldAppendValue(make([]byte, 0, len(b)), v), nil
}

// Parsed values: oldJSONObject, oldJSONArray, string, json.Number, bool or nil.
type (
	oldJSONMember struct {
		key string
		val any
	}
	oldJSONObject []oldJSONMember
	oldJSONArray  []any
)

type oldJSONParser struct {
	in  []byte
	pos int
}

func (p *oldJSONParser) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: %s at offset %d", ErrInvalidJSON, fmt.Sprintf(format, args...), p.pos)
}

func (p *oldJSONParser) skipSpace() {
	for p.pos < len(p.in) {
		switch p.in[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// value parses the value at p.pos; depth is the number of enclosing arrays
// and objects.
func (p *oldJSONParser) value(depth int) (any, error) {
	if p.pos == len(p.in) {
		return nil, p.errorf("unexpected end of input")
	}
	switch c := p.in[p.pos]; {
	case c == '{' || c == '[':
		if depth == oldMaxJSONDepth {
			return nil, p.errorf("nesting deeper than %d", oldMaxJSONDepth)
		}
		if c == '{' {
			return p.object(depth + 1)
		}
		return p.array(depth + 1)
	case c == '"':
		return p.string()
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	}
	for _, lit := range []struct {
		text string
		v    any
	}{{"true", true}, {"false", false}, {"null", nil}} {
		if bytes.HasPrefix(p.in[p.pos:], []byte(lit.text)) {
			p.pos += len(lit.text)
			return lit.v, nil
		}
	}
	return nil, p.errorf("invalid character %q", p.in[p.pos])
}

func (p *oldJSONParser) object(depth int) (oldJSONObject, error) {
	p.pos++ // {
	obj := oldJSONObject{}
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == '}' {
		p.pos++
		return obj, nil
	}
	for {
		if p.pos == len(p.in) || p.in[p.pos] != '"' {
			return nil, p.errorf("want an object key")
		}
		key, err := p.string()
		if err != nil {
			return nil, err
		}
		p.skipSpace()
		if p.pos == len(p.in) || p.in[p.pos] != ':' {
			return nil, p.errorf("want ':' after an object key")
		}
		p.pos++
		p.skipSpace()
		v, err := p.value(depth)
		if err != nil {
			return nil, err
		}
		obj = append(obj, oldJSONMember{key, v})
		p.skipSpace()
		if p.pos < len(p.in) && p.in[p.pos] == '}' {
			p.pos++
			break
		}
		if p.pos == len(p.in) || p.in[p.pos] != ',' {
			return nil, p.errorf("want ',' or '}' in an object")
		}
		p.pos++
		p.skipSpace()
	}
	slices.SortFunc(obj, func(a, b oldJSONMember) int { return oldCompareUTF16(a.key, b.key) })
	for i := 1; i < len(obj); i++ {
		if obj[i].key == obj[i-1].key {
			return nil, p.errorf("duplicate key in the object ending here")
		}
	}
	return obj, nil
}

func (p *oldJSONParser) array(depth int) (oldJSONArray, error) {
	p.pos++ // [
	arr := oldJSONArray{}
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == ']' {
		p.pos++
		return arr, nil
	}
	for {
		v, err := p.value(depth)
		if err != nil {
			return nil, err
		}
		arr = append(arr, v)
		p.skipSpace()
		if p.pos < len(p.in) && p.in[p.pos] == ']' {
			p.pos++
			return arr, nil
		}
		if p.pos == len(p.in) || p.in[p.pos] != ',' {
			return nil, p.errorf("want ',' or ']' in an array")
		}
		p.pos++
		p.skipSpace()
	}
}

// string parses a JSON string, returning its decoded value.
func (p *oldJSONParser) string() (string, error) {
	p.pos++ // opening quote
	var b []byte
	for p.pos < len(p.in) {
		c := p.in[p.pos]
		switch {
		case c == '"':
			p.pos++
			return string(b), nil
		case c == '\\':
			r, err := p.escape()
			if err != nil {
				return "", err
			}
			b = utf8.AppendRune(b, r)
		case c < 0x20:
			return "", p.errorf("control character 0x%02x in a string", c)
		case c < utf8.RuneSelf:
			b = append(b, c)
			p.pos++
		default:
			r, n := utf8.DecodeRune(p.in[p.pos:])
			if r == utf8.RuneError && n == 1 {
				return "", p.errorf("invalid UTF-8")
			}
			b = append(b, p.in[p.pos:p.pos+n]...)
			p.pos += n
		}
	}
	return "", p.errorf("unterminated string")
}

// escape decodes the escape sequence at p.pos, joining a UTF-16 surrogate
// pair written as two \u escapes.
func (p *oldJSONParser) escape() (rune, error) {
	if p.pos+1 == len(p.in) {
		return 0, p.errorf("unterminated escape")
	}
	c := p.in[p.pos+1]
	if i := strings.IndexByte(`"\/bfnrt`, c); i >= 0 {
		p.pos += 2
		return rune("\"\\/\b\f\n\r\t"[i]), nil
	}
	if c != 'u' {
		return 0, p.errorf("invalid escape")
	}
	r, ok := p.hex4()
	switch {
	case !ok:
		return 0, p.errorf("invalid \\u escape")
	case r >= 0xdc00 && r <= 0xdfff:
		return 0, p.errorf("lone low surrogate escape")
	case r >= 0xd800 && r <= 0xdbff:
		if p.pos+1 >= len(p.in) || p.in[p.pos] != '\\' || p.in[p.pos+1] != 'u' {
			return 0, p.errorf("lone high surrogate escape")
		}
		lo, ok := p.hex4()
		if !ok || lo < 0xdc00 || lo > 0xdfff {
			return 0, p.errorf("high surrogate escape not followed by a low one")
		}
		return 0x10000 + (r-0xd800)<<10 + (lo - 0xdc00), nil
	}
	return r, nil
}

// hex4 decodes the \uXXXX at p.pos and moves past it.
func (p *oldJSONParser) hex4() (rune, bool) {
	if p.pos+6 > len(p.in) {
		return 0, false
	}
	var r rune
	for _, c := range p.in[p.pos+2 : p.pos+6] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	p.pos += 6
	return r, true
}

// number validates the RFC 8259 number at p.pos and returns its text:
// -? (0 | [1-9][0-9]*) (\.[0-9]+)? ([eE][+-]?[0-9]+)?
func (p *oldJSONParser) number() (json.Number, error) {
	start := p.pos
	digits := func() int {
		n := 0
		for p.pos < len(p.in) && p.in[p.pos] >= '0' && p.in[p.pos] <= '9' {
			p.pos++
			n++
		}
		return n
	}
	if p.in[p.pos] == '-' {
		p.pos++
	}
	if p.pos < len(p.in) && p.in[p.pos] == '0' {
		p.pos++
	} else if digits() == 0 {
		return "", p.errorf("invalid number")
	}
	if p.pos < len(p.in) && p.in[p.pos] == '.' {
		p.pos++
		if digits() == 0 {
			return "", p.errorf("invalid number fraction")
		}
	}
	if p.pos < len(p.in) && (p.in[p.pos] == 'e' || p.in[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.in) && (p.in[p.pos] == '+' || p.in[p.pos] == '-') {
			p.pos++
		}
		if digits() == 0 {
			return "", p.errorf("invalid number exponent")
		}
	}
	return json.Number(p.in[start:p.pos]), nil
}

// oldCompareUTF16 orders valid UTF-8 strings by their UTF-16 code units, as
// RFC 8785 sorts object keys. It differs from byte order only between
// characters above U+FFFF and those in U+E000..U+FFFF.
func oldCompareUTF16(a, b string) int {
	for a != "" && b != "" {
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
		if ra != rb {
			if c := oldFirstUnit(ra) - oldFirstUnit(rb); c != 0 {
				return int(c)
			}
			return int(ra - rb) // same high surrogate: low ones follow code points
		}
		a, b = a[na:], b[nb:]
	}
	return len(a) - len(b)
}

// oldFirstUnit returns the first UTF-16 code unit of r.
func oldFirstUnit(r rune) rune {
	if r >= 0x10000 {
		return 0xd800 + (r-0x10000)>>10
	}
	return r
}

func oldAppendValue(out []byte, v any) []byte {
	switch v := v.(type) {
	case oldJSONObject:
		out = append(out, '{')
		for i, m := range v {
			if i > 0 {
				out = append(out, ',')
			}
			out = oldAppendString(out, m.key)
			out = append(out, ':')
			out = oldAppendValue(out, m.val)
		}
		return append(out, '}')
	case oldJSONArray:
		out = append(out, '[')
		for i, e := range v {
			if i > 0 {
				out = append(out, ',')
			}
			out = oldAppendValue(out, e)
		}
		return append(out, ']')
	case string:
		return oldAppendString(out, v)
	case json.Number:
		return append(out, v...)
	case bool:
		return strconv.AppendBool(out, v)
	default: // nil
		return append(out, "null"...)
	}
}

// oldAppendString writes s, which is valid UTF-8, in canonical escaping.
func oldAppendString(out []byte, s string) []byte {
	const hex = "0123456789abcdef"
	out = append(out, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"', '\\':
			out = append(out, '\\', c)
		case '\b':
			out = append(out, `\b`...)
		case '\f':
			out = append(out, `\f`...)
		case '\n':
			out = append(out, `\n`...)
		case '\r':
			out = append(out, `\r`...)
		case '\t':
			out = append(out, `\t`...)
		default:
			if c < 0x20 {
				out = append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			} else {
				out = append(out, c)
			}
		}
	}
	return append(out, '"')
}
