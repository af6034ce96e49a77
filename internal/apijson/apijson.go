// Package apijson holds what idemd's JSON endpoints (payments, orders)
// share: the request error and its RFC 9457 rendering, the bounded body
// read, and the media type check.
package apijson

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strings"

	"github.com/idemkit/idem/problem"
)

// FieldError says what is wrong with one field of a request.
type FieldError struct {
	Field  string `json:"field"`
	Detail string `json:"detail"`
}

// RequestError is a rejected request: 400 when the body is not a JSON object
// with known fields only, 413 when it is too large, 422 when fields are
// missing or invalid (Fields lists them).
type RequestError struct {
	Status int
	Detail string
	Fields []FieldError
}

func (e *RequestError) Error() string { return "bad request: " + e.Detail }

// BadRequest returns a 400 RequestError.
func BadRequest(format string, args ...any) *RequestError {
	return &RequestError{Status: http.StatusBadRequest, Detail: fmt.Sprintf(format, args...)}
}

// ReadBody reads r up to max bytes: a longer body is a 413 RequestError.
func ReadBody(r io.Reader, max int64) ([]byte, *RequestError) {
	body, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, BadRequest("unreadable body: %v", err)
	}
	if int64(len(body)) > max {
		return nil, &RequestError{Status: http.StatusRequestEntityTooLarge,
			Detail: fmt.Sprintf("the body exceeds %d bytes", max)}
	}
	return body, nil
}

// WriteRequestError answers err as a validation problem; invalidTitle is the
// title of a 422 ("Invalid payment"). An error that is not a RequestError is
// a 400.
func WriteRequestError(w http.ResponseWriter, err error, invalidTitle string) {
	var re *RequestError
	if !errors.As(err, &re) {
		re = BadRequest("%v", err)
	}
	p := problem.Problem{Type: problem.TypeValidation, Status: re.Status, Detail: re.Detail}
	switch re.Status {
	case http.StatusUnprocessableEntity:
		p.Title = invalidTitle
		p.Extensions = map[string]any{"errors": re.Fields}
	case http.StatusBadRequest:
		p.Title = "Malformed request body"
	case http.StatusRequestEntityTooLarge:
		p.Title = "Request body too large"
	}
	problem.Write(w, p)
}

// Object reads a JSON object of the known fields from dec, as raw values:
// unknown and duplicate members are 400 RequestErrors; what names the object
// in messages.
func Object(dec *json.Decoder, what string, known []string) (map[string]json.RawMessage, *RequestError) {
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, BadRequest("%s must be a JSON object", what)
	}
	out := make(map[string]json.RawMessage, len(known))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, BadRequest("malformed JSON: %v", err)
		}
		name, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, BadRequest("malformed JSON: %v", err)
		}
		switch {
		case !slices.Contains(known, name):
			return nil, BadRequest("unknown field %q in %s (known: %s)", name, what, strings.Join(known, ", "))
		case out[name] != nil:
			return nil, BadRequest("duplicate field %q in %s", name, what)
		}
		out[name] = v
	}
	if _, err := dec.Token(); err != nil {
		return nil, BadRequest("malformed JSON: %v", err)
	}
	return out, nil
}

// IsJSON reports whether the media type is application/json or +json.
func IsJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}
