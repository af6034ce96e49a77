package idemhttp

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"mime"
	"strings"
	"sync"
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
// its method, its target and its body. Two requests sent with the same key
// must have the same fingerprint, or idem answers 409 key-reused.
//
// route names the target of the request; the middleware passes the request
// target, path and query (URL.RequestURI), so the same key and body sent to
// /accounts/1 and /accounts/2, or with another query string, are a
// mismatch. A caller that passes a route pattern such as "/accounts/{id}"
// instead gets the same fingerprint for both.
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
	st := fingerprintPool.Get().(*fingerprintState)
	defer st.release()
	mode := byte(bodyRaw)
	if isJSON(contentType) {
		if c, err := appendCanonicalJSON(st.body[:0], body); err == nil {
			mode, body, st.body = bodyCanonicalJSON, c, c
		}
	}
	st.h.Reset()
	// Everything before the body in one Write: the version, method and
	// route, the body mode and the body's length.
	hdr := append(st.hdr[:0], fingerprintVersion)
	hdr = appendField(hdr, method)
	hdr = appendField(hdr, route)
	hdr = append(hdr, mode)
	hdr = binary.BigEndian.AppendUint64(hdr, uint64(len(body)))
	st.h.Write(hdr)
	st.h.Write(body)
	st.hdr = st.h.Sum(hdr[:0])
	var sum [32]byte
	copy(sum[:], st.hdr)
	return sum
}

// fingerprintState is the reusable scratch of one Fingerprint call: the
// hash, the buffer of its fields and the canonical body.
type fingerprintState struct {
	h    hash.Hash
	hdr  []byte
	body []byte
}

var fingerprintPool = sync.Pool{New: func() any { return &fingerprintState{h: sha256.New()} }}

// maxPooledBody caps the canonical body buffer kept for the next call.
const maxPooledBody = 256 << 10

func (st *fingerprintState) release() {
	if cap(st.body) > maxPooledBody {
		st.body = nil
	}
	if cap(st.hdr) > maxPooledBody {
		st.hdr = nil
	}
	fingerprintPool.Put(st)
}

// appendField appends s prefixed with its length as 8 bytes, big-endian.
func appendField(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}

// isJSON reports whether contentType names JSON: application/json or a
// structured syntax suffix +json (RFC 6839).
func isJSON(contentType string) bool {
	switch contentType {
	case "application/json", "application/json; charset=utf-8", "application/json;charset=utf-8",
		"application/json; charset=UTF-8", "application/json;charset=UTF-8":
		// The usual spellings, which mime.ParseMediaType accepts as
		// application/json, without its allocations.
		return true
	case "":
		return false
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || (strings.HasSuffix(mt, "+json") && strings.Contains(mt, "/"))
}
