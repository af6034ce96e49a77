package idemhttp

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"unicode/utf8"
)

// AnonymousPrincipal is DefaultScope's principal for requests without an
// Authorization header: all of them share one key space.
const AnonymousPrincipal = "anonymous"

// DefaultScope identifies the principal by the Authorization header: the
// first 16 bytes of its SHA-256, hex-encoded, so that credentials are never
// stored as they are. It is unsalted: a guessable credential (HTTP Basic
// with a password) can be found from it offline; records and log lines
// hold it. Requests without the header share AnonymousPrincipal.
func DefaultScope(r *http.Request) (string, error) {
	auth := r.Header.Get("Authorization")
	if auth == "" {
		return AnonymousPrincipal, nil
	}
	// Hash a pooled copy: []byte(auth) would allocate for any real token.
	st := fingerprintPool.Get().(*fingerprintState)
	st.hdr = append(st.hdr[:0], auth...)
	sum := sha256.Sum256(st.hdr)
	st.release()
	var buf [len("auth:") + 32]byte
	copy(buf[:], "auth:")
	hex.Encode(buf[len("auth:"):], sum[:16])
	return string(buf[:]), nil
}

// DefaultRoute returns the ServeMux pattern that matched the request
// (Request.Pattern), or the URL path when there is none.
func DefaultRoute(r *http.Request) string {
	if r.Pattern != "" {
		return r.Pattern
	}
	return r.URL.Path
}

// scopeOf joins principal, method and route into the stored scope. The
// method has no space, and a principal's spaces (and percent signs) are
// escaped, so the first space always ends the principal: principal "a POST"
// with route "/x" cannot meet principal "a" with route "POST /x" (a
// ServeMux pattern).
func scopeOf(principal, method, route string) string {
	if strings.ContainsAny(principal, " %") {
		principal = principalEscaper.Replace(principal)
	}
	return principal + " " + method + " " + route
}

var principalEscaper = strings.NewReplacer("%", "%25", " ", "%20")

// maxScopeBytes is the longest scope stored as it is. A longer one, or one
// that is not valid UTF-8 or contains a NUL byte (a route that is the
// decoded URL path, /files/%ff or /files/%00, or a principal), is stored as
// "h:" and the hex SHA-256 of it: PostgreSQL refuses such text (and an
// index entry over about 2.7 KB), which answered 503 on every retry. 2 KiB
// (with a key of at most 255 bytes) is always storable, and keeps almost
// every scope PostgreSQL stored before as it was.
const maxScopeBytes = 2048

// storedScope returns scope, or its hash when PostgreSQL could not store
// it (see maxScopeBytes).
func storedScope(scope string) string {
	if len(scope) <= maxScopeBytes && utf8.ValidString(scope) && strings.IndexByte(scope, 0) < 0 {
		return scope
	}
	sum := sha256.Sum256([]byte(scope))
	return "h:" + hex.EncodeToString(sum[:])
}

// maxLogScope bounds a scope in a log line.
const maxLogScope = 200

// logScope is scope for a log line: at most maxLogScope bytes.
func logScope(scope string) string {
	if len(scope) <= maxLogScope {
		return scope
	}
	return scope[:maxLogScope] + "…"
}
