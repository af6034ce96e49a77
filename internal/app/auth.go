package app

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/problem"
)

type principalKey struct{}

// principalOf identifies the caller: the hash of the bearer token, or the
// shared anonymous principal without Authorization. The scheme is matched
// case-insensitively (RFC 9110), so "bearer t" and "Bearer t" are the same
// principal, which idemhttp.DefaultScope (a hash of the raw header) would
// tell apart.
func principalOf(h http.Header) (string, error) {
	vals := h.Values("Authorization")
	switch len(vals) {
	case 0:
		return idemhttp.AnonymousPrincipal, nil
	case 1:
	default:
		return "", errors.New("more than one Authorization header")
	}
	scheme, token, _ := strings.Cut(strings.TrimSpace(vals[0]), " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return "", errors.New(`the Authorization header must be "Bearer <token>"`)
	}
	token = strings.TrimSpace(token)
	if token == "" {
		return "", errors.New("the bearer token is empty")
	}
	sum := sha256.Sum256([]byte(token))
	return "bearer:" + hex.EncodeToString(sum[:16]), nil
}

// authenticate answers 401 for a malformed Authorization header and
// otherwise puts the principal in the request context.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := principalOf(r.Header)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="idemd"`)
			problem.WriteError(w, http.StatusUnauthorized, problem.TypeUnauthenticated, "Unauthenticated", err.Error()+".")
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	})
}

// scope is idemhttp's Config.Scope: the principal authenticate found.
func scope(r *http.Request) (string, error) {
	if p, ok := r.Context().Value(principalKey{}).(string); ok {
		return p, nil
	}
	return "", errors.New("no principal: the route is not behind authenticate")
}
