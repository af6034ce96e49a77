package problem

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"
)

// MediaType is the media type of a problem details document (RFC 9457).
const MediaType = "application/problem+json"

// TypeBase is the prefix of idem's problem type URIs: the documentation page
// listing them, one anchor per problem type.
const TypeBase = "https://github.com/idemkit/idem/blob/main/docs/problems.md#"

// TypeURI returns the type URI of idem's problem type slug, which is also the
// anchor of its section in docs/problems.md.
func TypeURI(slug string) string { return TypeBase + slug }

// idem's problem types. docs/problems.md says, for each, when idem returns
// it, with which status, and what the client should do.
const (
	// TypeKeyMissing (400): a protected endpoint got no Idempotency-Key.
	TypeKeyMissing = TypeBase + "key-missing"
	// TypeKeyMalformed (400): the Idempotency-Key value is not a valid key.
	TypeKeyMalformed = TypeBase + "key-malformed"
	// TypeKeyMultiple (400): the request carries more than one
	// Idempotency-Key header.
	TypeKeyMultiple = TypeBase + "key-multiple"
	// TypeKeyReused (409): the key was already used on the same endpoint
	// (principal, method and route) with a different request target (path
	// and query) or body.
	TypeKeyReused = TypeBase + "key-reused"
	// TypeRequestInProgress (409, with Retry-After): another request with the
	// same key is still executing.
	TypeRequestInProgress = TypeBase + "request-in-progress"
	// TypeBodyTooLarge (413): the request body exceeds the limit idem reads
	// to fingerprint it.
	TypeBodyTooLarge = TypeBase + "body-too-large"
	// TypeBodyTimeout (408): the request body did not arrive within the
	// server's read deadline (a slow or stalled upload); nothing was
	// executed, and the same request may be sent again with the same key.
	TypeBodyTimeout = TypeBase + "body-timeout"
	// TypeResponseTooLarge (500): the handler's response exceeds what idem
	// can store for replay.
	TypeResponseTooLarge = TypeBase + "response-too-large"
	// TypeStoreUnavailable (503): the idempotency store cannot be reached;
	// idem fails closed and does not run the handler. 500, without
	// Retry-After, when idem's tables are missing (not migrated).
	TypeStoreUnavailable = TypeBase + "store-unavailable"
	// TypeOutcomeUnknown (503): idem cannot tell whether the command
	// committed; retry with the same key.
	TypeOutcomeUnknown = TypeBase + "outcome-unknown"
	// TypeTransactionAborted (500): a statement of the handler failed and
	// aborted its transaction (or a deferred constraint failed at
	// COMMIT): nothing was committed.
	TypeTransactionAborted = TypeBase + "transaction-aborted"
	// TypeTransactionEnded (500): the handler committed or rolled back
	// the idempotency middleware's transaction itself: no outcome was
	// stored, and the effect may have been applied (the detail says when
	// nothing was committed: sqlitedriver rolls such a COMMIT back).
	TypeTransactionEnded = TypeBase + "transaction-ended"
	// TypeUnauthenticated (401): the scope hook could not identify the
	// principal the key belongs to.
	TypeUnauthenticated = TypeBase + "unauthenticated"
	// TypeValidation (400 or 422): generic invalid input, for applications.
	TypeValidation = TypeBase + "validation"
	// TypeConflict (409): generic, for applications: the request names a
	// resource that already exists with other details (the same business
	// identity, another amount).
	TypeConflict = TypeBase + "conflict"
)

// Problem is an RFC 9457 problem details object.
//
// It encodes to JSON with the standard members type, title, status, detail
// and instance (each omitted when empty or zero) followed by the Extensions
// flattened at the top level in key order. An extension whose name equals a
// standard member (compared case-insensitively, with Unicode case folding,
// because encoding/json matches names that way) is dropped: it can never
// overwrite or shadow a standard member. A name that is not valid UTF-8 is
// written, as encoding/json writes it, with U+FFFD for each bad byte; of
// names written alike only the first, in key order, is kept, so that no
// member appears twice (UnmarshalJSON refuses such a document).
type Problem struct {
	// Type is a URI reference identifying the problem type. Write uses
	// "about:blank" when it is empty.
	Type string
	// Title is a short, human-readable summary of the problem type. Write
	// uses http.StatusText(Status) when it is empty.
	Title string
	// Status is the HTTP status code.
	Status int
	// Detail explains this occurrence of the problem, for humans.
	Detail string
	// Instance is a URI reference identifying this occurrence.
	Instance string
	// Extensions are additional members, written at the top level.
	Extensions map[string]any
}

// isStandard reports whether name would collide with a standard member:
// equal under Unicode case folding, as encoding/json matches a name to a
// field (so "\u017ftatus", with a long s, is status too).
func isStandard(name string) bool {
	for _, m := range [...]string{"type", "title", "status", "detail", "instance"} {
		if strings.EqualFold(name, m) {
			return true
		}
	}
	return false
}

// MarshalJSON encodes p as described on Problem. It fails only when an
// extension value cannot be encoded.
func (p Problem) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	var names map[string]bool // the extension names written, as decoded
	add := func(name string, v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("problem: member %q: %w", name, err)
		}
		if buf.Len() > 1 {
			buf.WriteByte(',')
		}
		k, _ := json.Marshal(name) // a string always encodes
		buf.Write(k)
		buf.WriteByte(':')
		buf.Write(b)
		return nil
	}
	if p.Type != "" {
		_ = add("type", p.Type)
	}
	if p.Title != "" {
		_ = add("title", p.Title)
	}
	if p.Status != 0 {
		_ = add("status", p.Status)
	}
	if p.Detail != "" {
		_ = add("detail", p.Detail)
	}
	if p.Instance != "" {
		_ = add("instance", p.Instance)
	}
	for _, k := range slices.Sorted(maps.Keys(p.Extensions)) {
		// A name that is not valid UTF-8 is written with U+FFFD in place
		// of each bad byte, so two names can be written as one: the first
		// is kept, and the document has each member once.
		name := k
		if !utf8.ValidString(k) {
			name = string([]rune(k)) // U+FFFD for each bad byte, as encoding/json
		}
		if isStandard(k) || names[name] {
			continue
		}
		if names == nil {
			names = map[string]bool{}
		}
		names[name] = true
		if err := add(k, p.Extensions[k]); err != nil {
			return nil, err
		}
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// UnmarshalJSON decodes a problem details object. As RFC 9457 requires, a
// standard member whose value has the wrong JSON type is ignored. Every
// other member goes to Extensions, with numbers decoded as json.Number so
// they survive a round trip exactly.
//
// A document that is not one JSON object is refused with an error, and so
// is one in which a member name appears twice at the top level (after
// unescaping; names differing in case are distinct, as they are for
// RFC 8259): JSON leaves which occurrence counts to the reader
// (encoding/json keeps the last, a reader that stops at the first type
// member sees the first), so two readers of such a document could act on
// different problems. Names inside an extension's value are not checked.
func (p *Problem) UnmarshalJSON(b []byte) error {
	m, err := decodeObject(b)
	if err != nil {
		return err
	}
	*p = Problem{}
	str := func(name string) string {
		s, _ := m[name].(string)
		return s
	}
	p.Type, p.Title, p.Detail, p.Instance = str("type"), str("title"), str("detail"), str("instance")
	if n, ok := m["status"].(json.Number); ok {
		if i, err := n.Int64(); err == nil && i >= 100 && i <= 999 {
			p.Status = int(i)
		}
	}
	for k, v := range m {
		if isStandard(k) {
			continue
		}
		if p.Extensions == nil {
			p.Extensions = make(map[string]any)
		}
		p.Extensions[k] = v
	}
	return nil
}

// decodeObject decodes b, which must be one JSON object whose member names
// are unique, into a map (numbers as json.Number).
func decodeObject(b []byte) (map[string]any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	t, err := d.Token()
	if err != nil {
		return nil, fmt.Errorf("problem: %w", err)
	}
	if t != json.Delim('{') {
		return nil, fmt.Errorf("problem: document is not a JSON object")
	}
	m := map[string]any{}
	for d.More() {
		t, err := d.Token()
		if err != nil {
			return nil, fmt.Errorf("problem: %w", err)
		}
		name, _ := t.(string) // a member name is always a string
		if _, dup := m[name]; dup {
			return nil, fmt.Errorf("problem: member %q appears twice", name)
		}
		var v any
		if err := d.Decode(&v); err != nil {
			return nil, fmt.Errorf("problem: %w", err)
		}
		m[name] = v
	}
	if _, err := d.Token(); err != nil { // the closing brace
		return nil, fmt.Errorf("problem: %w", err)
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, fmt.Errorf("problem: trailing data after the JSON object")
	}
	return m, nil
}

// Write sends p as the response: it sets Content-Type to
// application/problem+json, Cache-Control to no-store and
// X-Content-Type-Options to nosniff, then writes the status code and the
// JSON body.
//
// Empty fields get defaults first: Type "about:blank", Title
// http.StatusText(Status). A Status outside 400..599 is not an error status
// and becomes 500, so that the status line and the body always agree. If an
// extension cannot be encoded the extensions are dropped rather than
// sending no body at all. Headers such as Retry-After are the caller's to
// set before calling Write. Write deletes the headers that would describe
// another body than the problem document, which a handler that failed
// midway may have set (a gzip Content-Encoding on the plain JSON body breaks
// the client): Content-Encoding, Content-Length, Content-Range,
// Content-Language, Content-Location, Content-Disposition, Content-MD5,
// Content-Digest, Repr-Digest, Digest, ETag and Last-Modified.
func Write(w http.ResponseWriter, p Problem) {
	if p.Status < 400 || p.Status > 599 {
		p.Status = http.StatusInternalServerError
	}
	if p.Type == "" {
		p.Type = "about:blank"
	}
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	body, err := p.MarshalJSON()
	if err != nil {
		p.Extensions = nil
		body, _ = p.MarshalJSON() // cannot fail without extensions
	}
	h := w.Header()
	for _, name := range staleHeaders {
		h.Del(name)
	}
	h.Set("Content-Type", MediaType)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(body, '\n'))
}

// staleHeaders describe a representation: set for the body a handler meant
// to send, they would lie about the problem document Write sends instead.
var staleHeaders = []string{
	"Content-Encoding", "Content-Length", "Content-Range", "Content-Language",
	"Content-Location", "Content-Disposition", "Content-MD5", "Content-Digest",
	"Repr-Digest", "Digest", "ETag", "Last-Modified",
}

// WriteError is Write for a problem without instance or extensions.
func WriteError(w http.ResponseWriter, status int, typ, title, detail string) {
	Write(w, Problem{Type: typ, Title: title, Status: status, Detail: detail})
}
