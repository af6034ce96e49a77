package idemhttp

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"mime"
	"strings"
)

// fingerprintVersion is hashed first, so that changing the scheme later
// changes every fingerprint instead of silently comparing unlike hashes.
const fingerprintVersion = 1

// Body modes, hashed so that a canonicalised JSON body never collides with
// a raw body that happens to have the same bytes.
const (
	bodyRaw           = 'r'
	bodyCanonicalJSON = 'j'
)

// Fingerprint returns the SHA-256 fingerprint of what a request asks for:
// its method, its route and its body. Two requests sent with the same key
// must have the same fingerprint, or idem answers 409 key-reused.
//
// route names the target of the request. Only route and body tell requests
// apart, so when path parameters are part of the command they must be in
// one of them: with a route pattern such as "/accounts/{id}", the same key
// and body sent to /accounts/1 and /accounts/2 get the same fingerprint.
// The method is compared as given (HTTP methods are case-sensitive).
//
// When the media type of contentType is application/json or ends in +json
// (parameters such as charset are ignored) and the body is valid for
// CanonicalJSON, the canonical form is hashed, so key order, whitespace and
// string escaping do not change the fingerprint; otherwise the raw bytes are.
//
// The hash covers a version byte, then method, route, a body mode byte
// (canonical JSON or raw) and the body, each string length-prefixed so that
// bytes cannot move from one field to the next.
func Fingerprint(method, route, contentType string, body []byte) [32]byte {
	mode := byte(bodyRaw)
	if isJSON(contentType) {
		if c, err := CanonicalJSON(body); err == nil {
			mode, body = bodyCanonicalJSON, c
		}
	}
	h := sha256.New()
	h.Write([]byte{fingerprintVersion})
	writeField(h, []byte(method))
	writeField(h, []byte(route))
	h.Write([]byte{mode})
	writeField(h, body)
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}

// writeField writes b prefixed with its length as 8 bytes, big-endian.
func writeField(h hash.Hash, b []byte) {
	h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(b))))
	h.Write(b)
}

// isJSON reports whether contentType names JSON: application/json or a
// structured syntax suffix +json (RFC 6839).
func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || (strings.HasSuffix(mt, "+json") && strings.Contains(mt, "/"))
}
