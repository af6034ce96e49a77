package idemhttp

import (
	"encoding/json"
	"net/http"
)

// encodeHeaders stores the allow-listed headers of h as JSON.
func encodeHeaders(h http.Header, allow []string) ([]byte, error) {
	kept := make(map[string][]string)
	for _, name := range allow {
		if v := h.Values(name); len(v) > 0 {
			kept[name] = v
		}
	}
	return json.Marshal(kept)
}

// decodeHeaders adds the stored headers to h.
func decodeHeaders(b []byte, h http.Header) error {
	if len(b) == 0 {
		return nil
	}
	var kept map[string][]string
	if err := json.Unmarshal(b, &kept); err != nil {
		return err
	}
	for k, vs := range kept {
		for _, v := range vs {
			h.Add(k, v)
		}
	}
	return nil
}
