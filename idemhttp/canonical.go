package idemhttp

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"
)

// ErrInvalidJSON is returned, wrapped with the reason and byte offset, by
// CanonicalJSON for a document it cannot canonicalise.
var ErrInvalidJSON = errors.New("idemhttp: JSON cannot be canonicalised")

// maxJSONDepth bounds the nesting of arrays and objects, like encoding/json
// does, so that hostile input cannot grow the stack without limit.
const maxJSONDepth = 10000

// CanonicalJSON returns the canonical form of the JSON document b: equal
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
// CanonicalJSON rejects, with ErrInvalidJSON, what would make the canonical
// form ambiguous or lossy: invalid JSON, invalid UTF-8 and lone UTF-16
// surrogate escapes (which decoders silently replace with U+FFFD, so two
// different bodies would collide), duplicate object keys (decoders disagree
// on which one wins), data after the value, a byte order mark, and nesting
// deeper than 10000 arrays or objects.
func CanonicalJSON(b []byte) ([]byte, error) {
	// The canonical form is never longer than the document: it drops
	// whitespace and only ever shortens escapes.
	out, err := appendCanonicalJSON(make([]byte, 0, len(b)), b)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// appendCanonicalJSON appends the canonical form of b to dst. On error dst
// is returned unchanged, with the error.
func appendCanonicalJSON(dst, b []byte) ([]byte, error) {
	p := parserPool.Get().(*jsonParser)
	p.in = b
	defer p.release()
	p.skipSpace()
	v, err := p.value(0)
	if err != nil {
		return dst, err
	}
	p.skipSpace()
	if p.pos != len(b) {
		return dst, p.errorf("data after the JSON value")
	}
	return p.appendValue(dst, v), nil
}

// The parser records the document as jsonValues, which refer to the input
// or to the parser's buffers by offsets: no value is allocated on its own,
// and each byte of the output is written once, after every object has been
// sorted.
const (
	kindRaw    = iota // number or literal: in[a:b], written verbatim
	kindString        // string without escapes: in[a:b] is its content, canonical as is
	kindEscStr        // string with escapes: its decoded content is strs[a:b]
	kindArray         // elems[a:b]
	kindObject        // members[a:b], sorted by key
)

type jsonValue struct {
	kind uint8
	a, b int
}

type jsonMember struct {
	key, val jsonValue // key is a kindString or a kindEscStr
}

type jsonParser struct {
	in  []byte
	pos int
	// strs holds the decoded content of strings with escapes.
	strs []byte
	// elems and members hold the values of closed arrays and objects;
	// elemStack and memberStack those of the open ones, innermost last.
	elems       []jsonValue
	members     []jsonMember
	elemStack   []jsonValue
	memberStack []jsonMember
}

var parserPool = sync.Pool{New: func() any { return new(jsonParser) }}

// Buffers grown beyond these are not kept in the pool.
const (
	maxPooledStrs    = 256 << 10
	maxPooledEntries = 16 << 10
)

// release forgets the document and returns p to the pool.
func (p *jsonParser) release() {
	p.in, p.pos = nil, 0
	if cap(p.strs) > maxPooledStrs {
		p.strs = nil
	}
	if cap(p.elems)+cap(p.elemStack) > maxPooledEntries {
		p.elems, p.elemStack = nil, nil
	}
	if cap(p.members)+cap(p.memberStack) > maxPooledEntries {
		p.members, p.memberStack = nil, nil
	}
	p.strs, p.elems, p.members = p.strs[:0], p.elems[:0], p.members[:0]
	p.elemStack, p.memberStack = p.elemStack[:0], p.memberStack[:0]
	parserPool.Put(p)
}

func (p *jsonParser) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: %s at offset %d", ErrInvalidJSON, fmt.Sprintf(format, args...), p.pos)
}

func (p *jsonParser) skipSpace() {
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
func (p *jsonParser) value(depth int) (jsonValue, error) {
	if p.pos == len(p.in) {
		return jsonValue{}, p.errorf("unexpected end of input")
	}
	switch c := p.in[p.pos]; {
	case c == '{' || c == '[':
		if depth == maxJSONDepth {
			return jsonValue{}, p.errorf("nesting deeper than %d", maxJSONDepth)
		}
		if c == '{' {
			return p.object(depth + 1)
		}
		return p.array(depth + 1)
	case c == '"':
		return p.string()
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	case c == 't':
		return p.literal("true")
	case c == 'f':
		return p.literal("false")
	case c == 'n':
		return p.literal("null")
	}
	return jsonValue{}, p.errorf("invalid character %q", p.in[p.pos])
}

// literal parses true, false or null, whose first byte is at p.pos.
func (p *jsonParser) literal(text string) (jsonValue, error) {
	start := p.pos
	if len(p.in)-start < len(text) || string(p.in[start:start+len(text)]) != text {
		return jsonValue{}, p.errorf("invalid character %q", p.in[p.pos])
	}
	p.pos += len(text)
	return jsonValue{kindRaw, start, p.pos}, nil
}

func (p *jsonParser) object(depth int) (jsonValue, error) {
	p.pos++ // {
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == '}' {
		p.pos++
		return jsonValue{kind: kindObject}, nil
	}
	open := len(p.memberStack)
	for {
		if p.pos == len(p.in) || p.in[p.pos] != '"' {
			return jsonValue{}, p.errorf("want an object key")
		}
		key, err := p.string()
		if err != nil {
			return jsonValue{}, err
		}
		p.skipSpace()
		if p.pos == len(p.in) || p.in[p.pos] != ':' {
			return jsonValue{}, p.errorf("want ':' after an object key")
		}
		p.pos++
		p.skipSpace()
		v, err := p.value(depth)
		if err != nil {
			return jsonValue{}, err
		}
		p.memberStack = append(p.memberStack, jsonMember{key, v})
		p.skipSpace()
		if p.pos < len(p.in) && p.in[p.pos] == '}' {
			p.pos++
			break
		}
		if p.pos == len(p.in) || p.in[p.pos] != ',' {
			return jsonValue{}, p.errorf("want ',' or '}' in an object")
		}
		p.pos++
		p.skipSpace()
	}
	ms := p.memberStack[open:]
	p.sortMembers(ms)
	for i := 1; i < len(ms); i++ {
		if bytes.Equal(p.text(ms[i].key), p.text(ms[i-1].key)) {
			return jsonValue{}, p.errorf("duplicate key in the object ending here")
		}
	}
	start := len(p.members)
	p.members = append(p.members, ms...)
	p.memberStack = p.memberStack[:open]
	return jsonValue{kindObject, start, len(p.members)}, nil
}

// sortMembers sorts ms by key. Small objects, the common case, are
// insertion sorted: already sorted ones (as a canonicalising client sends
// them) in one pass.
func (p *jsonParser) sortMembers(ms []jsonMember) {
	if len(ms) > 12 {
		slices.SortFunc(ms, func(a, b jsonMember) int { return compareUTF16(p.text(a.key), p.text(b.key)) })
		return
	}
	for i := 1; i < len(ms); i++ {
		for j := i; j > 0 && compareUTF16(p.text(ms[j-1].key), p.text(ms[j].key)) > 0; j-- {
			ms[j-1], ms[j] = ms[j], ms[j-1]
		}
	}
}

func (p *jsonParser) array(depth int) (jsonValue, error) {
	p.pos++ // [
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == ']' {
		p.pos++
		return jsonValue{kind: kindArray}, nil
	}
	open := len(p.elemStack)
	for {
		v, err := p.value(depth)
		if err != nil {
			return jsonValue{}, err
		}
		p.elemStack = append(p.elemStack, v)
		p.skipSpace()
		if p.pos < len(p.in) && p.in[p.pos] == ']' {
			p.pos++
			start := len(p.elems)
			p.elems = append(p.elems, p.elemStack[open:]...)
			p.elemStack = p.elemStack[:open]
			return jsonValue{kindArray, start, len(p.elems)}, nil
		}
		if p.pos == len(p.in) || p.in[p.pos] != ',' {
			return jsonValue{}, p.errorf("want ',' or ']' in an array")
		}
		p.pos++
		p.skipSpace()
	}
}

// text returns the decoded content of a string value.
func (p *jsonParser) text(v jsonValue) []byte {
	if v.kind == kindEscStr {
		return p.strs[v.a:v.b]
	}
	return p.in[v.a:v.b]
}

// string parses a JSON string. Without escapes its content is already
// canonical: it has neither `"`, `\` nor control characters, and is valid
// UTF-8. Otherwise it is decoded into p.strs.
func (p *jsonParser) string() (jsonValue, error) {
	p.pos++ // opening quote
	start := p.pos
	for p.pos < len(p.in) {
		c := p.in[p.pos]
		switch {
		case c == '"':
			p.pos++
			return jsonValue{kindString, start, p.pos - 1}, nil
		case c == '\\':
			return p.escapedString(start)
		case c < 0x20:
			return jsonValue{}, p.errorf("control character 0x%02x in a string", c)
		case c < utf8.RuneSelf:
			p.pos++
		default:
			r, n := utf8.DecodeRune(p.in[p.pos:])
			if r == utf8.RuneError && n == 1 {
				return jsonValue{}, p.errorf("invalid UTF-8")
			}
			p.pos += n
		}
	}
	return jsonValue{}, p.errorf("unterminated string")
}

// escapedString goes on parsing the string whose content starts at start,
// from its first escape at p.pos, decoding it into p.strs.
func (p *jsonParser) escapedString(start int) (jsonValue, error) {
	s := len(p.strs)
	b := append(p.strs, p.in[start:p.pos]...)
	for p.pos < len(p.in) {
		c := p.in[p.pos]
		switch {
		case c == '"':
			p.pos++
			p.strs = b
			return jsonValue{kindEscStr, s, len(b)}, nil
		case c == '\\':
			r, err := p.escape()
			if err != nil {
				return jsonValue{}, err
			}
			b = utf8.AppendRune(b, r)
		case c < 0x20:
			return jsonValue{}, p.errorf("control character 0x%02x in a string", c)
		case c < utf8.RuneSelf:
			b = append(b, c)
			p.pos++
		default:
			r, n := utf8.DecodeRune(p.in[p.pos:])
			if r == utf8.RuneError && n == 1 {
				return jsonValue{}, p.errorf("invalid UTF-8")
			}
			b = append(b, p.in[p.pos:p.pos+n]...)
			p.pos += n
		}
	}
	return jsonValue{}, p.errorf("unterminated string")
}

// escape decodes the escape sequence at p.pos, joining a UTF-16 surrogate
// pair written as two \u escapes.
func (p *jsonParser) escape() (rune, error) {
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
func (p *jsonParser) hex4() (rune, bool) {
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

// digits moves past the digits at p.pos and returns how many there were.
func (p *jsonParser) digits() int {
	start := p.pos
	for p.pos < len(p.in) && p.in[p.pos] >= '0' && p.in[p.pos] <= '9' {
		p.pos++
	}
	return p.pos - start
}

// number validates the RFC 8259 number at p.pos, which is kept verbatim:
// -? (0 | [1-9][0-9]*) (\.[0-9]+)? ([eE][+-]?[0-9]+)?
func (p *jsonParser) number() (jsonValue, error) {
	start := p.pos
	if p.in[p.pos] == '-' {
		p.pos++
	}
	if p.pos < len(p.in) && p.in[p.pos] == '0' {
		p.pos++
	} else if p.digits() == 0 {
		return jsonValue{}, p.errorf("invalid number")
	}
	if p.pos < len(p.in) && p.in[p.pos] == '.' {
		p.pos++
		if p.digits() == 0 {
			return jsonValue{}, p.errorf("invalid number fraction")
		}
	}
	if p.pos < len(p.in) && (p.in[p.pos] == 'e' || p.in[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.in) && (p.in[p.pos] == '+' || p.in[p.pos] == '-') {
			p.pos++
		}
		if p.digits() == 0 {
			return jsonValue{}, p.errorf("invalid number exponent")
		}
	}
	return jsonValue{kindRaw, start, p.pos}, nil
}

// compareUTF16 orders valid UTF-8 strings by their UTF-16 code units, as
// RFC 8785 sorts object keys. It differs from byte order only between
// characters above U+FFFF and those in U+E000..U+FFFF: in UTF-8 their
// leading bytes are 0xF0..0xF4 and 0xEE..0xEF, and in UTF-16 the former
// start with a surrogate, 0xD800..0xDBFF, which sorts first.
//
// At the first byte where a and b differ, both are either inside the same
// character (same leading byte, so byte order is code point order within one
// UTF-16 length, which is UTF-16 order) or at the start of two characters.
func compareUTF16(a, b []byte) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	if i == n {
		return len(a) - len(b)
	}
	ca, cb := a[i], b[i]
	if ca >= 0xee && cb >= 0xee && (ca >= 0xf0) != (cb >= 0xf0) {
		// U+E000..U+FFFF against a supplementary character: its
		// surrogate comes first.
		if ca >= 0xf0 {
			return -1
		}
		return 1
	}
	return int(ca) - int(cb)
}

// appendValue writes the canonical form of v.
func (p *jsonParser) appendValue(out []byte, v jsonValue) []byte {
	switch v.kind {
	case kindObject:
		out = append(out, '{')
		for i, m := range p.members[v.a:v.b] {
			if i > 0 {
				out = append(out, ',')
			}
			out = p.appendValue(out, m.key)
			out = append(out, ':')
			out = p.appendValue(out, m.val)
		}
		return append(out, '}')
	case kindArray:
		out = append(out, '[')
		for i, e := range p.elems[v.a:v.b] {
			if i > 0 {
				out = append(out, ',')
			}
			out = p.appendValue(out, e)
		}
		return append(out, ']')
	case kindString:
		out = append(out, '"')
		out = append(out, p.in[v.a:v.b]...)
		return append(out, '"')
	case kindEscStr:
		return appendString(out, p.strs[v.a:v.b])
	default: // kindRaw
		return append(out, p.in[v.a:v.b]...)
	}
}

// appendString writes s, which is valid UTF-8, in canonical escaping.
func appendString(out, s []byte) []byte {
	const hex = "0123456789abcdef"
	out = append(out, '"')
	for len(s) > 0 {
		// Copy the run that needs no escaping at once.
		i := 0
		for i < len(s) && s[i] >= 0x20 && s[i] != '"' && s[i] != '\\' {
			i++
		}
		out = append(out, s[:i]...)
		if i == len(s) {
			break
		}
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
			out = append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		s = s[i+1:]
	}
	return append(out, '"')
}
