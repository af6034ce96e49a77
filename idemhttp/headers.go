package idemhttp

import (
	"encoding/json"
	"net/http"
	"net/textproto"
	"slices"
	"unicode/utf8"
)

// encodeHeaders stores the allow-listed headers of h as JSON: the bytes
// json.Marshal gives for a map[string][]string of the allowed names that h
// has, written without reflection. Stored records keep this format. A
// response with trailers is stored by encodeWithTrailers.
func encodeHeaders(h http.Header, allow []string) ([]byte, error) {
	if hasTrailers(h) {
		return encodeWithTrailers(h, allow)
	}
	var buf [16]string
	kept := buf[:0]
	size := 2
	for _, name := range allow {
		if v := h.Values(name); len(v) > 0 {
			kept = append(kept, name)
			size += len(name) + 6
			for _, s := range v {
				size += len(s) + 3
			}
		}
	}
	// json.Marshal sorts map keys bytewise; a name listed twice is one key.
	slices.Sort(kept)
	kept = slices.Compact(kept)
	out := make([]byte, 0, size)
	out = append(out, '{')
	for i, name := range kept {
		if i > 0 {
			out = append(out, ',')
		}
		out = appendJSONString(out, name)
		out = append(out, ':', '[')
		for j, s := range h.Values(name) {
			if j > 0 {
				out = append(out, ',')
			}
			out = appendJSONString(out, s)
		}
		out = append(out, ']')
	}
	return append(out, '}'), nil
}

// appendJSONString appends s as encoding/json writes a string (with its
// default HTML escaping): <, > and & as \u003c, \u003e and \u0026, control
// characters escaped, invalid UTF-8 as \ufffd, U+2028 and U+2029 escaped.
func appendJSONString(out []byte, s string) []byte {
	const hex = "0123456789abcdef"
	out = append(out, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			out = append(out, s[start:i]...)
			switch c {
			case '\\', '"':
				out = append(out, '\\', c)
			case '\b':
				out = append(out, '\\', 'b')
			case '\f':
				out = append(out, '\\', 'f')
			case '\n':
				out = append(out, '\\', 'n')
			case '\r':
				out = append(out, '\\', 'r')
			case '\t':
				out = append(out, '\\', 't')
			default:
				out = append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			out = append(out, s[start:i]...)
			out = append(out, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			out = append(out, s[start:i]...)
			out = append(out, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			i += n
			continue
		}
		i += n
		start = i
	}
	out = append(out, s[start:]...)
	return append(out, '"')
}

// varyHeader is the one header whose values a response adds to those an
// outer middleware set rather than replacing them.
const varyHeader = "Vary"

// addVary returns vs after the values of Vary that h has. A response's
// Vary lists every request header any layer's answer depends on: a CORS
// middleware outside this one adds Origin (its Access-Control-Allow-Origin
// depends on it), and the handler's own Vary, replacing it, would let a
// cache serve one origin's answer to another.
func addVary(h http.Header, vs []string) []string {
	outer := h[varyHeader]
	if len(outer) == 0 {
		return vs
	}
	return append(slices.Clip(outer), vs...)
}

// decodeHeaders sets the stored headers in h, replacing the values h had
// under their names (as the handler's own response did), except Vary's,
// which the stored ones are added to (addVary).
func decodeHeaders(b []byte, h http.Header) error {
	if len(b) == 0 {
		return nil
	}
	if decodeHeadersFast(b, h) {
		return nil
	}
	var kept map[string][]string
	if err := json.Unmarshal(b, &kept); err != nil {
		return err
	}
	set := make(map[string]bool, len(kept))
	for k, vs := range kept {
		if key := textproto.CanonicalMIMEHeaderKey(k); !set[key] {
			set[key] = true
			if key != varyHeader {
				h.Del(key) // replaced, as in decodeHeadersFast
			}
		}
		for _, v := range vs {
			h.Add(k, v)
		}
	}
	return nil
}

// decodeHeadersFast decodes what encodeHeaders usually writes, without
// reflection: an object without whitespace of distinct names, each with a
// non-empty array of strings, every string printable ASCII or valid UTF-8
// without escapes. It reports false, having changed nothing, for anything
// else, which decodeHeaders then reads with encoding/json.
func decodeHeadersFast(b []byte, h http.Header) bool {
	if len(b) < 2 || b[0] != '{' || b[len(b)-1] != '}' {
		return false
	}
	if len(b) == 2 {
		return true
	}
	// One string for every name and value, one slice for every value.
	s := string(b)
	var nbuf [8]string
	var ebuf [8]int
	names, ends := nbuf[:0], ebuf[:0]
	var values []string
	i := 1
	for {
		name, next, ok := scanPlainString(s, i)
		if !ok || next+1 >= len(s) || s[next] != ':' || s[next+1] != '[' || slices.Contains(names, name) {
			return false
		}
		i = next + 2
		for {
			v, next, ok := scanPlainString(s, i)
			if !ok || next >= len(s) {
				return false
			}
			if values == nil {
				values = make([]string, 0, len(s)/8)
			}
			values = append(values, v)
			i = next + 1
			if s[next] == ']' {
				break
			}
			if s[next] != ',' {
				return false
			}
		}
		names, ends = append(names, name), append(ends, len(values))
		if i == len(s)-1 {
			break
		}
		if s[i] != ',' {
			return false
		}
		i++
	}
	start := 0
	var sbuf [8]string
	set := sbuf[:0] // canonical keys set by this call
	for k, name := range names {
		vs := values[start:ends[k]:ends[k]]
		start = ends[k]
		key := textproto.CanonicalMIMEHeaderKey(name)
		// What h had under the name is replaced, not added to: the
		// handler's response replaced what an outer middleware had set
		// (recorder.flush), and so does a replay. Two stored names of
		// one key add up.
		if slices.Contains(set, key) {
			vs = append(h[key], vs...)
		} else {
			set = append(set, key)
			if key == varyHeader {
				vs = addVary(h, vs)
			}
		}
		h[key] = vs
	}
	return true
}

// scanPlainString reads the JSON string at s[i] if it has no escapes, no
// control characters and is valid UTF-8, returning its content and the
// index after its closing quote.
func scanPlainString(s string, i int) (string, int, bool) {
	if i >= len(s) || s[i] != '"' {
		return "", 0, false
	}
	start := i + 1
	ascii := true
	for i = start; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"':
			v := s[start:i]
			if !ascii && !utf8.ValidString(v) {
				return "", 0, false
			}
			return v, i + 1, true
		case c == '\\' || c < 0x20:
			return "", 0, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return "", 0, false
}
