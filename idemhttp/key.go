package idemhttp

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// KeyHeader is the name of the request header carrying the idempotency key.
const KeyHeader = "Idempotency-Key"

// MaxKeyLen is the maximum length of a key, in characters (bytes: a key is
// ASCII).
const MaxKeyLen = 255

// Errors returned by ParseKey, possibly wrapped with details; test them with
// errors.Is.
var (
	ErrKeyMissing   = errors.New("idemhttp: Idempotency-Key header missing")
	ErrKeyMultiple  = errors.New("idemhttp: Idempotency-Key header sent more than once")
	ErrKeyMalformed = errors.New("idemhttp: malformed Idempotency-Key")
)

// ErrScopeUnavailable, wrapped in an error of Config.Scope, says that the
// principal could not be looked up now (the store of API keys or secrets
// is unreachable): the request is answered 503 store-unavailable with
// Retry-After, not 401, which clients do not retry. The error's text is
// logged, not sent.
var ErrScopeUnavailable = errors.New("idemhttp: the request's principal cannot be looked up now")

// ParseKey returns the idempotency key of a request's headers.
//
// The header must appear exactly once (ErrKeyMissing, ErrKeyMultiple).
// Surrounding spaces and tabs are ignored. The value is either a bare key or
// an RFC 8941 structured-field string, as the IETF Idempotency-Key draft
// specifies: `"abc"` and `abc` are the same key, and inside quotes `\"` and
// `\\` stand for `"` and `\`. A bare key must not contain `"`. Either way
// the key must be 1 to MaxKeyLen characters of visible ASCII (0x21 to 0x7E);
// anything else is ErrKeyMalformed. Error details never include the value,
// which is client input.
func ParseKey(h http.Header) (string, error) {
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
		if key, err = unquote(v); err != nil {
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

// unquote decodes an RFC 8941 sf-string: DQUOTE *chr DQUOTE, where chr is
// printable ASCII (0x20 to 0x7E) other than `"` and `\`, or the escapes `\"`
// and `\\`. The closing quote must end s. A key without escapes is returned
// as a substring of s.
func unquote(s string) (string, error) {
	var b []byte // the key, once an escape made it differ from s
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			if b == nil {
				b = append(make([]byte, 0, len(s)), s[1:i]...)
			}
			i++
			if i == len(s) || (s[i] != '"' && s[i] != '\\') {
				return "", fmt.Errorf("%w: bad escape at offset %d", ErrKeyMalformed, i-1)
			}
			b = append(b, s[i])
		case c == '"':
			if i != len(s)-1 {
				return "", fmt.Errorf("%w: data after closing quote at offset %d", ErrKeyMalformed, i)
			}
			if b == nil {
				return s[1:i], nil
			}
			return string(b), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("%w: byte 0x%02x at offset %d is not printable ASCII", ErrKeyMalformed, c, i)
		default:
			if b != nil {
				b = append(b, c)
			}
		}
	}
	return "", fmt.Errorf("%w: missing closing quote", ErrKeyMalformed)
}
