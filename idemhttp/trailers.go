package idemhttp

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
)

// Trailers. net/http sends as trailers, once the handler returned, the
// values of the names declared in the Trailer header (set before
// WriteHeader) and those of the keys with http.TrailerPrefix. A replay
// does the same with what encodeWithTrailers stored: each trailer under
// http.TrailerPrefix and its name, in the headers blob, so stored records
// keep their format and a record without trailers is stored as before.

// encodeWithTrailers is encodeHeaders for a response with a Trailer header
// or a key with http.TrailerPrefix: the allowed headers, as encodeHeaders
// stores them, and the trailers whose names are allowed, each under
// http.TrailerPrefix and its name (the key as the handler set it, or the
// canonical declared name), its values in the order net/http sends them.
// A declared trailer whose declaration is stored (Trailer in the allowed
// names) is not stored again: the replay declares it, and net/http sends
// its stored header's values as the trailer, as the first time.
func encodeWithTrailers(h http.Header, allow []string) ([]byte, error) {
	kept := make(map[string][]string)
	declared := false
	for _, name := range allow {
		if v := h.Values(name); len(v) > 0 {
			kept[name] = v
			declared = declared || textproto.CanonicalMIMEHeaderKey(name) == "Trailer"
		}
	}
	allowed := func(name string) bool {
		name = textproto.CanonicalMIMEHeaderKey(name)
		return slices.ContainsFunc(allow, func(a string) bool { return textproto.CanonicalMIMEHeaderKey(a) == name })
	}
	for k, v := range h {
		if name, ok := strings.CutPrefix(k, http.TrailerPrefix); ok && len(v) > 0 && allowed(name) {
			kept[k] = slices.Concat(kept[k], v)
		}
	}
	if !declared {
		// As net/http reads the declarations: comma-separated, trimmed,
		// canonical, without the names RFC 9110 forbids in a trailer.
		for _, v := range h["Trailer"] {
			for name := range strings.SplitSeq(v, ",") {
				name = textproto.CanonicalMIMEHeaderKey(textproto.TrimString(name))
				if name == "" || !validTrailer(name) || !allowed(name) {
					continue
				}
				if vs := h[name]; len(vs) > 0 {
					kept[http.TrailerPrefix+name] = slices.Concat(kept[http.TrailerPrefix+name], vs)
				}
			}
		}
	}
	return json.Marshal(kept)
}

// hasTrailers reports whether h may make net/http send trailers: a Trailer
// header or a key with http.TrailerPrefix. A response without them is
// stored by encodeHeaders' own code, as before; this pass over h is all
// they cost it.
func hasTrailers(h http.Header) bool {
	for k := range h {
		if strings.HasPrefix(k, "Trailer") {
			return true
		}
	}
	return false
}

// storedTrailers reports whether stored headers, as encodeHeaders writes
// them, make their replay send trailers (isTrailerKey): it must not then
// set a Content-Length, which on HTTP/1.1 leaves no room for them. Headers
// without "Trailer" in their bytes are told apart without being decoded.
func storedTrailers(b []byte) bool {
	if !bytes.Contains(b, []byte("Trailer")) {
		return false
	}
	h := make(http.Header)
	if decodeHeaders(b, h) != nil {
		return false
	}
	for k := range h {
		if isTrailerKey(k) {
			return true
		}
	}
	return false
}

// isTrailerKey reports whether a stored header name, canonical, makes its
// replay send trailers: the Trailer header, or a trailer stored with
// http.TrailerPrefix.
func isTrailerKey(key string) bool {
	return strings.HasPrefix(key, "Trailer") && (len(key) == len("Trailer") || key[len("Trailer")] == ':')
}

// validTrailer reports whether net/http sends a declared trailer of the
// canonical name (golang.org/x/net/http/httpguts.ValidTrailerHeader).
func validTrailer(name string) bool {
	if strings.HasPrefix(name, "If-") {
		return false
	}
	switch name {
	case "Authorization", "Cache-Control", "Connection", "Content-Encoding", "Content-Length", "Content-Range",
		"Content-Type", "Expect", "Host", "Keep-Alive", "Max-Forwards", "Pragma", "Proxy-Authenticate",
		"Proxy-Authorization", "Proxy-Connection", "Range", "Realm", "Te", "Trailer", "Transfer-Encoding",
		"Www-Authenticate":
		return false
	}
	return true
}
