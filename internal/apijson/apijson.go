// Package apijson holds what idemd's JSON endpoints (payments, orders)
// share: the request error and its RFC 9457 rendering, the bounded body
// read, the media type check, and the 503 of a database that failed the
// handler (WriteUnavailable).
//
// A problem's detail describes the client's input only: an error from the
// network (a connection broken mid-body) or from Go is never shown, since it
// names addresses and internals; RequestError.Err keeps it for the log.
package apijson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/idemkit/idem/internal/dberr"
	"github.com/idemkit/idem/problem"
)

// FieldError says what is wrong with one field of a request.
type FieldError struct {
	Field  string `json:"field"`
	Detail string `json:"detail"`
}

// RequestError is a rejected request: 400 when the body is not a JSON object
// with known fields only (or could not be read), 413 when it is too large,
// 422 when fields are missing or invalid (Fields lists them).
type RequestError struct {
	Status int
	// Detail is the problem's detail: it must not hold anything but what
	// the client sent.
	Detail string
	Fields []FieldError
	// Title, if set, replaces the title WriteRequestError gives Status.
	Title string
	// Err is the cause for the server's log (a network error while reading
	// the body); it is never sent to the client.
	Err error
}

func (e *RequestError) Error() string { return "bad request: " + e.Detail }

// Unwrap returns Err.
func (e *RequestError) Unwrap() error { return e.Err }

// Titles and details shared with idemhttp's own answers, so that a client
// gets one answer whichever layer rejects its request.
const (
	// TitleTooLarge is the title of a 413 body-too-large problem.
	TitleTooLarge = "Request body too large"
	// TitleUnreadable and DetailUnreadable answer a body that could not be
	// read (the connection broke or timed out mid-body).
	TitleUnreadable  = "Unreadable request body"
	DetailUnreadable = "The request body could not be read."
)

// TooLarge returns the 413 RequestError of a body over max bytes; it is
// written as idemhttp's body-too-large problem, with the same detail.
func TooLarge(max int64) *RequestError {
	return &RequestError{Status: http.StatusRequestEntityTooLarge, Title: TitleTooLarge,
		Detail: "The body exceeds " + strconv.FormatInt(max, 10) + " bytes."}
}

// BadRequest returns a 400 RequestError.
func BadRequest(format string, args ...any) *RequestError {
	return &RequestError{Status: http.StatusBadRequest, Detail: fmt.Sprintf(format, args...)}
}

// ReadBody reads r up to max bytes: a longer body is a 413 RequestError
// (TooLarge; also when r is an http.MaxBytesReader that hit its own
// limit), a read error a 400 whose detail does not repeat the error (it
// names the connection's addresses): the error is in Err.
func ReadBody(r io.Reader, max int64) ([]byte, *RequestError) {
	body, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		if tooLarge, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, TooLarge(tooLarge.Limit)
		}
		return nil, &RequestError{Status: http.StatusBadRequest, Title: TitleUnreadable,
			Detail: DetailUnreadable, Err: err}
	}
	if int64(len(body)) > max {
		return nil, TooLarge(max)
	}
	return body, nil
}

// WriteRequestError answers err as a validation problem, or for a 413 as
// the body-too-large problem idemhttp answers; invalidTitle is the title of
// a 422 ("Invalid payment"). An error that is not a RequestError is a 400
// whose detail does not repeat it.
func WriteRequestError(w http.ResponseWriter, err error, invalidTitle string) {
	var re *RequestError
	if !errors.As(err, &re) {
		re = &RequestError{Status: http.StatusBadRequest, Detail: "The request body is invalid.", Err: err}
	}
	p := problem.Problem{Type: problem.TypeValidation, Status: re.Status, Detail: re.Detail}
	switch re.Status {
	case http.StatusUnprocessableEntity:
		p.Title = invalidTitle
		p.Extensions = map[string]any{"errors": re.Fields}
	case http.StatusBadRequest:
		p.Title = "Malformed request body"
	case http.StatusRequestEntityTooLarge:
		p.Type, p.Title = problem.TypeBodyTooLarge, TitleTooLarge
	}
	if re.Title != "" {
		p.Title = re.Title
	}
	problem.Write(w, p)
}

// CheckBody answers the bodies that cannot hold the JSON object a handler
// reads with a 400 that says what is wrong with them, not only that they
// are not an object: one that is not valid UTF-8, one that starts with a
// byte order mark (which JSON between systems must not have, RFC 8259, 8.1;
// some Windows tools add it) and one that is empty or white space only.
func CheckBody(body []byte) *RequestError {
	switch {
	case !utf8.Valid(body):
		return BadRequest("the body is not valid UTF-8")
	case bytes.HasPrefix(body, []byte("\uFEFF")):
		return BadRequest("the body starts with a byte order mark (U+FEFF): send the JSON without it (RFC 8259, 8.1)")
	case len(bytes.Trim(body, " \t\r\n")) == 0:
		return BadRequest("the body is empty: it must be a JSON object")
	}
	return nil
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
			return nil, malformed(err)
		}
		name, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, malformed(err)
		}
		switch {
		case !slices.Contains(known, name):
			return nil, BadRequest("unknown field %s in %s (known: %s)", quoteName(name), what, strings.Join(known, ", "))
		case out[name] != nil:
			return nil, BadRequest("duplicate field %s in %s", quoteName(name), what)
		}
		out[name] = v
	}
	if _, err := dec.Token(); err != nil {
		return nil, malformed(err)
	}
	return out, nil
}

// maxQuotedName is the number of characters of a member name a detail
// quotes.
const maxQuotedName = 64

// quoteName quotes a member name for a detail, cut to maxQuotedName
// characters: the client's 64 KiB name would otherwise be echoed, several
// times its size once escaped, in a problem stored under its key.
func quoteName(name string) string {
	if utf8.RuneCountInString(name) <= maxQuotedName {
		return strconv.Quote(name)
	}
	n := 0
	for i := range name {
		if n == maxQuotedName {
			return strconv.Quote(name[:i]) + "... (" + strconv.Itoa(len(name)) + " bytes)"
		}
		n++
	}
	return strconv.Quote(name)
}

// malformed is the 400 of a JSON syntax error, which describes the
// client's input; any other error (dec's reader failed) is not repeated.
func malformed(err error) *RequestError {
	if _, ok := errors.AsType[*json.SyntaxError](err); ok || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return BadRequest("malformed JSON: %v", err)
	}
	return &RequestError{Status: http.StatusBadRequest, Title: TitleUnreadable, Detail: DetailUnreadable, Err: err}
}

// IsJSON reports whether the media type is application/json or type/x+json,
// as idemhttp.Fingerprint reads it; an empty or malformed one is not.
func IsJSON(contentType string) bool {
	isJSON, _ := mediaType(contentType)
	return isJSON
}

// mediaType reports whether contentType is JSON (IsJSON) and whether its
// charset parameter, if it has one, is UTF-8 (in any case): JSON between
// systems is UTF-8 (RFC 8259, 8.1), and the handlers read no other.
func mediaType(contentType string) (isJSON, utf8 bool) {
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false, false
	}
	cs, ok := params["charset"] // ParseMediaType lower-cases the names
	// A +json without a type ("x+json", which ParseMediaType accepts) is
	// not JSON, as for idemhttp, which would fingerprint its body raw.
	return mt == "application/json" || (strings.HasSuffix(mt, "+json") && strings.Contains(mt, "/")),
		!ok || strings.EqualFold(cs, "utf-8")
}

// WriteUnsupportedCharset answers 415 to a request whose JSON body is
// declared in a charset other than UTF-8 (application/json;
// charset=iso-8859-1); what names the resource sent ("payment").
func WriteUnsupportedCharset(w http.ResponseWriter, what string) {
	problem.WriteError(w, http.StatusUnsupportedMediaType, "",
		http.StatusText(http.StatusUnsupportedMediaType), "Send the "+what+" as application/json in UTF-8 (charset=utf-8, or no charset).")
}

// WriteUnsupportedMediaType answers 415 to a request whose Content-Type is
// missing or not JSON; what names the resource sent ("payment").
func WriteUnsupportedMediaType(w http.ResponseWriter, what string) {
	problem.WriteError(w, http.StatusUnsupportedMediaType, "",
		http.StatusText(http.StatusUnsupportedMediaType), "Send the "+what+" as application/json.")
}

// Encoded reports whether h gives the body a content coding other than
// identity (Content-Encoding: gzip, say), which the handlers do not decode.
func Encoded(h http.Header) bool {
	for _, v := range h.Values("Content-Encoding") {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
				return true
			}
		}
	}
	return false
}

// WriteUnsupportedEncoding answers 415 with Accept-Encoding: identity (RFC
// 9110, 15.5.16) to a request whose body has a content coding; what names
// the resource sent ("payment").
func WriteUnsupportedEncoding(w http.ResponseWriter, what string) {
	w.Header().Set("Accept-Encoding", "identity")
	problem.WriteError(w, http.StatusUnsupportedMediaType, "",
		http.StatusText(http.StatusUnsupportedMediaType), "Send the "+what+" without Content-Encoding: the body is read uncompressed.")
}

// Refuse answers 415 to a request whose Content-Type is missing or not
// JSON (WriteUnsupportedMediaType), declares a charset other than UTF-8
// (WriteUnsupportedCharset), or whose body has a Content-Encoding
// (WriteUnsupportedEncoding), and reports whether it did; what names the
// resource sent ("payment").
func Refuse(w http.ResponseWriter, r *http.Request, what string) bool {
	isJSON, utf8 := mediaType(r.Header.Get("Content-Type"))
	switch {
	case !isJSON:
		WriteUnsupportedMediaType(w, what)
	case !utf8:
		WriteUnsupportedCharset(w, what)
	case Encoded(r.Header):
		WriteUnsupportedEncoding(w, what)
	default:
		return false
	}
	return true
}

// RequireJSON answers 415 to the requests Refuse refuses (a Content-Type
// missing, not JSON or in a charset other than UTF-8, a Content-Encoding)
// and passes the others to next. Put it in front of the idempotency
// middleware: the 415 then claims no key and stores nothing, so the
// corrected request may reuse the key.
func RequireJSON(what string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !Refuse(w, r, what) {
			next.ServeHTTP(w, r)
		}
	})
}

// Unavailable reports whether err, from the database while a handler ran
// in the idempotency middleware's transaction, is a passing failure of the
// database (a connection lost or terminated, a restart, a serialization
// failure, a database that refuses writes, the server's resources, a
// busy SQLite: dberr.Transient) rather than a bug or bad data.
// The transaction is then rolled back, nothing committed: the handler
// answers WriteUnavailable.
func Unavailable(err error) bool { return dberr.Transient(err) }

// WriteUnavailable answers 503 store-unavailable with Retry-After: 1, as
// idemhttp does when it cannot reach the store, to a request whose
// database failed while it ran (Unavailable). A command's writes were
// rolled back, the 5xx is not stored, and a retry with the same key
// executes it: a generic client retries a 503, not a 500. what names the
// resource ("order").
func WriteUnavailable(w http.ResponseWriter, r *http.Request, what string) {
	detail := "The database failed while the " + what + " was processed: the command was not executed. Retry with the same key."
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		detail = "The database failed while the " + what + " was read. Retry later."
	}
	w.Header().Set("Retry-After", "1")
	problem.WriteError(w, http.StatusServiceUnavailable, problem.TypeStoreUnavailable, "Database unavailable", detail)
}

// DetailLoneSurrogate is the field error of a string that HasLoneSurrogate.
const DetailLoneSurrogate = `must not contain a lone UTF-16 surrogate escape (like "\ud800"): it is not a character`

// HasLoneSurrogate reports whether the JSON string v (valid JSON, as a
// Decoder returned it) escapes a UTF-16 surrogate that is not half of a
// pair: a high one (\ud800 to \udbff) not followed by a low one, or a low
// one (\udc00 to \udfff) alone. encoding/json decodes each as U+FFFD, so
// "e\ud800" and "e\udbff" would become one text: the handlers refuse such a
// string rather than store another than the client sent.
func HasLoneSurrogate(v []byte) bool {
	// esc decodes the \uXXXX escape at i, if there is one.
	esc := func(i int) (r rune, ok bool) {
		if i+6 > len(v) || v[i] != '\\' || v[i+1] != 'u' {
			return 0, false
		}
		n, err := strconv.ParseUint(string(v[i+2:i+6]), 16, 16)
		return rune(n), err == nil
	}
	for i := 0; i < len(v); i++ {
		if v[i] != '\\' {
			continue
		}
		r, ok := esc(i)
		if !ok {
			i++ // a two-character escape: \" \\ \/ \b \f \n \r \t
			continue
		}
		switch {
		case r >= 0xDC00 && r <= 0xDFFF:
			return true
		case r >= 0xD800 && r <= 0xDBFF:
			if lo, ok := esc(i + 6); !ok || lo < 0xDC00 || lo > 0xDFFF {
				return true
			}
			i += 6 // the low half
		}
		i += 5
	}
	return false
}
