package idemhttp

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
)

// AnonymousPrincipal is DefaultScope's principal for requests without an
// Authorization header: all of them share one key space.
const AnonymousPrincipal = "anonymous"

// DefaultScope identifies the principal by the Authorization header: the
// first 16 bytes of its SHA-256, hex-encoded, so that credentials are never
// stored. Requests without the header share AnonymousPrincipal.
func DefaultScope(r *http.Request) (string, error) {
	auth := r.Header.Get("Authorization")
	if auth == "" {
		return AnonymousPrincipal, nil
	}
	sum := sha256.Sum256([]byte(auth))
	return "auth:" + hex.EncodeToString(sum[:16]), nil
}

// DefaultRoute returns the ServeMux pattern that matched the request
// (Request.Pattern), or the URL path when there is none.
func DefaultRoute(r *http.Request) string {
	if r.Pattern != "" {
		return r.Pattern
	}
	return r.URL.Path
}

// scopeOf joins principal, method and route into the stored scope.
func scopeOf(principal, method, route string) string {
	return principal + " " + method + " " + route
}
