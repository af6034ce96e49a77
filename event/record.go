package event

import (
	"bytes"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/google/uuid"
)

// Header names under which an envelope's fields travel in a Kafka record.
const (
	// HeaderEventID holds Envelope.ID in canonical text form.
	HeaderEventID = "idem-event-id"
	// HeaderEventType holds Envelope.Type.
	HeaderEventType = "idem-event-type"
	// HeaderSagaID holds Envelope.SagaID; absent when it is empty.
	HeaderSagaID = "idem-saga-id"
	// HeaderOccurredAt holds Envelope.OccurredAt in UTC, time.RFC3339Nano.
	HeaderOccurredAt = "idem-occurred-at"
	// ReservedHeaderPrefix starts every header name this package owns.
	// FromRecord ignores unknown headers with this prefix, so a consumer
	// keeps working when a newer producer adds one.
	ReservedHeaderPrefix = "idem-"
)

// Header names of the CloudEvents 1.0 Kafka protocol binding, binary
// content mode, as written by RecordHeadersWith and read by FromRecord.
// Each CloudEvents attribute travels in a header named "ce_" followed by
// the attribute name; the data content type travels in "content-type".
const (
	// CloudEventsHeaderPrefix starts every CloudEvents attribute header.
	// In a record that FromRecord reads as a CloudEvent (one with a
	// HeaderCESpecVersion header), names with this prefix are reserved:
	// they are never copied to Envelope.Headers. With a CloudEvents
	// HeaderFormat, RecordHeadersWith refuses extra headers with it.
	CloudEventsHeaderPrefix = "ce_"
	// HeaderCESpecVersion holds the CloudEvents version, CloudEventsSpecVersion.
	HeaderCESpecVersion = "ce_specversion"
	// HeaderCEID holds Envelope.ID, as HeaderEventID does.
	HeaderCEID = "ce_id"
	// HeaderCESource holds the source given in HeaderOptions (it names the
	// producer, not the event). FromRecord neither requires nor keeps it.
	HeaderCESource = "ce_source"
	// HeaderCEType holds Envelope.Type.
	HeaderCEType = "ce_type"
	// HeaderCESubject holds Envelope.Key. FromRecord ignores it: the key
	// comes from the record key.
	HeaderCESubject = "ce_subject"
	// HeaderCETime holds Envelope.OccurredAt in UTC, time.RFC3339Nano.
	// CloudEvents makes it optional; idem requires it.
	HeaderCETime = "ce_time"
	// HeaderCEPartitionKey holds Envelope.Key, the CloudEvents partitioning
	// extension (the binding maps it to the record key). FromRecord
	// ignores it.
	HeaderCEPartitionKey = "ce_partitionkey"
	// HeaderCESagaID holds Envelope.SagaID as the extension attribute
	// "idemsagaid"; absent when SagaID is empty.
	HeaderCESagaID = "ce_idemsagaid"
	// HeaderContentType holds the payload's media type (the CloudEvents
	// datacontenttype attribute): ContentTypeJSON, unless Envelope.Headers
	// sets "content-type" itself.
	HeaderContentType = "content-type"

	// CloudEventsSpecVersion is the only CloudEvents version written and
	// accepted.
	CloudEventsSpecVersion = "1.0"
	// ContentTypeJSON is the media type of an envelope's payload.
	ContentTypeJSON = "application/json"
)

// HeaderFormat selects the headers that carry an envelope's fields in a
// Kafka record. The zero value is HeaderFormatIdem. FromRecord reads every
// format, so a consumer needs no setting.
type HeaderFormat uint8

// Header formats.
const (
	// HeaderFormatIdem writes idem's own headers (HeaderEventID and
	// friends), as RecordHeaders does. The default.
	HeaderFormatIdem HeaderFormat = iota
	// HeaderFormatCloudEvents writes the CloudEvents Kafka binding's
	// binary-mode headers (HeaderCESpecVersion and friends, and
	// HeaderContentType) instead, for consumers that speak CloudEvents.
	HeaderFormatCloudEvents
	// HeaderFormatBoth writes the idem headers followed by the CloudEvents
	// ones, so that older idem consumers and CloudEvents consumers can read
	// the same record (a migration step).
	HeaderFormatBoth
)

var headerFormatNames = [...]string{
	HeaderFormatIdem:        "idem",
	HeaderFormatCloudEvents: "cloudevents",
	HeaderFormatBoth:        "both",
}

// String returns "idem", "cloudevents" or "both" (the names
// ParseHeaderFormat accepts), or "HeaderFormat(n)" for an unknown value.
func (f HeaderFormat) String() string {
	if int(f) < len(headerFormatNames) {
		return headerFormatNames[f]
	}
	return fmt.Sprintf("HeaderFormat(%d)", uint8(f))
}

// ParseHeaderFormat returns the format named s: "idem" (or ""),
// "cloudevents" or "both", in any case.
func ParseHeaderFormat(s string) (HeaderFormat, error) {
	if s == "" {
		return HeaderFormatIdem, nil
	}
	for f, name := range headerFormatNames {
		if strings.EqualFold(s, name) {
			return HeaderFormat(f), nil
		}
	}
	return 0, fmt.Errorf("event: unknown header format %q (want idem, cloudevents or both)", truncate(s))
}

// MarshalText returns f.String(), so that a HeaderFormat works with
// flag.TextVar and text-based configuration.
func (f HeaderFormat) MarshalText() ([]byte, error) {
	if int(f) >= len(headerFormatNames) {
		return nil, fmt.Errorf("event: unknown header format %d", uint8(f))
	}
	return []byte(f.String()), nil
}

// UnmarshalText sets f with ParseHeaderFormat.
func (f *HeaderFormat) UnmarshalText(b []byte) error {
	v, err := ParseHeaderFormat(string(b))
	if err != nil {
		return err
	}
	*f = v
	return nil
}

// cloudEvents reports whether f writes the CloudEvents headers.
func (f HeaderFormat) cloudEvents() bool {
	return f == HeaderFormatCloudEvents || f == HeaderFormatBoth
}

// HeaderOptions say how RecordHeadersWith writes an envelope's headers. The
// zero value writes the idem headers, as RecordHeaders does.
type HeaderOptions struct {
	// Format picks the header set. Defaults to HeaderFormatIdem.
	Format HeaderFormat
	// Source is the CloudEvents source attribute (HeaderCESource): a
	// non-empty URI-reference naming the producer, such as "/idem",
	// "/orders-service" or "https://orders.example.com". Required by the
	// CloudEvents formats, ignored by HeaderFormatIdem.
	Source string
}

// Validate reports whether o can be used: a known Format, and with a
// CloudEvents format a Source that is a URI-reference without spaces.
func (o HeaderOptions) Validate() error {
	if int(o.Format) >= len(headerFormatNames) {
		return fmt.Errorf("event: unknown header format %d", uint8(o.Format))
	}
	if !o.Format.cloudEvents() {
		return nil
	}
	if o.Source == "" {
		return fmt.Errorf("event: header format %s needs a Source (ce_source), such as \"/idem\" or a service URI", o.Format)
	}
	if strings.ContainsFunc(o.Source, unicode.IsSpace) {
		return fmt.Errorf("event: Source %q contains spaces: it must be a URI-reference", truncate(o.Source))
	}
	if _, err := url.Parse(o.Source); err != nil {
		return fmt.Errorf("event: Source %q is not a URI-reference: %w", truncate(o.Source), err)
	}
	return nil
}

// Header is one Kafka record header. It has the fields of kgo.RecordHeader,
// so the Kafka glue converts with kgo.RecordHeader(h) and back without
// this package importing a Kafka client.
type Header struct {
	Key   string
	Value []byte
}

// RecordKey returns the Kafka record key: the aggregate key.
func (e Envelope) RecordKey() []byte { return []byte(e.Key) }

// RecordHeaders returns the Kafka record headers for e: the idem headers
// (ID, type, saga ID when set, occurrence time) followed by e.Headers sorted
// by name. The record value is e.Payload and the record key e.RecordKey().
// It is RecordHeadersWith with the zero HeaderOptions.
func (e Envelope) RecordHeaders() []Header {
	hs := make([]Header, 0, 4+len(e.Headers))
	hs = e.appendIdemHeaders(hs)
	return e.appendExtraHeaders(hs, e.extraNames())
}

// RecordHeadersWith returns the Kafka record headers for e in the format
// o.Format:
//
//   - HeaderFormatIdem: RecordHeaders().
//   - HeaderFormatCloudEvents: the CloudEvents binary-mode headers
//     ce_specversion ("1.0"), ce_id (ID), ce_source (o.Source), ce_type
//     (Type), ce_subject (Key), ce_time (OccurredAt in UTC, RFC 3339 with
//     the fraction, as HeaderOccurredAt), ce_partitionkey (Key),
//     ce_idemsagaid (SagaID, when set) and content-type ("application/json",
//     unless e.Headers has a "content-type" of its own), then e.Headers
//     sorted by name.
//   - HeaderFormatBoth: the idem headers, then the CloudEvents ones, then
//     e.Headers.
//
// The record key is e.RecordKey() and the value e.Payload in every format.
// It fails if o is not valid (see HeaderOptions.Validate), or, with a
// CloudEvents format, if a name in e.Headers starts with "ce_" in any case
// (ErrReservedHeader): such a header would be read as a CloudEvents
// attribute, and FromRecord would drop it.
func (e Envelope) RecordHeadersWith(o HeaderOptions) ([]Header, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if !o.Format.cloudEvents() {
		return e.RecordHeaders(), nil
	}
	names := e.extraNames()
	ownContentType := false
	for _, name := range names {
		if hasCEPrefix(name) {
			return nil, fmt.Errorf("event: headers of %s: %w: %q is a CloudEvents attribute header", e.ID, ErrReservedHeader, truncate(name))
		}
		ownContentType = ownContentType || strings.EqualFold(name, HeaderContentType)
	}
	hs := make([]Header, 0, 4+9+len(names))
	if o.Format == HeaderFormatBoth {
		hs = e.appendIdemHeaders(hs)
	}
	hs = append(hs,
		Header{HeaderCESpecVersion, []byte(CloudEventsSpecVersion)},
		Header{HeaderCEID, []byte(e.ID.String())},
		Header{HeaderCESource, []byte(o.Source)},
		Header{HeaderCEType, []byte(e.Type)},
		Header{HeaderCESubject, []byte(e.Key)},
		Header{HeaderCETime, []byte(e.occurredAtText())},
		Header{HeaderCEPartitionKey, []byte(e.Key)},
	)
	if e.SagaID != "" {
		hs = append(hs, Header{HeaderCESagaID, []byte(e.SagaID)})
	}
	if !ownContentType {
		hs = append(hs, Header{HeaderContentType, []byte(ContentTypeJSON)})
	}
	return e.appendExtraHeaders(hs, names), nil
}

func (e Envelope) appendIdemHeaders(hs []Header) []Header {
	hs = append(hs,
		Header{HeaderEventID, []byte(e.ID.String())},
		Header{HeaderEventType, []byte(e.Type)},
	)
	if e.SagaID != "" {
		hs = append(hs, Header{HeaderSagaID, []byte(e.SagaID)})
	}
	return append(hs, Header{HeaderOccurredAt, []byte(e.occurredAtText())})
}

func (e Envelope) occurredAtText() string {
	return e.OccurredAt.UTC().Format(time.RFC3339Nano)
}

// extraNames returns the names of e.Headers, sorted.
func (e Envelope) extraNames() []string {
	names := make([]string, 0, len(e.Headers))
	for name := range e.Headers {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

func (e Envelope) appendExtraHeaders(hs []Header, names []string) []Header {
	for _, name := range names {
		hs = append(hs, Header{name, []byte(e.Headers[name])})
	}
	return hs
}

// hasCEPrefix reports whether name starts with CloudEventsHeaderPrefix, in
// any case.
func hasCEPrefix(name string) bool {
	return len(name) >= len(CloudEventsHeaderPrefix) &&
		strings.EqualFold(name[:len(CloudEventsHeaderPrefix)], CloudEventsHeaderPrefix)
}

// fields are the envelope fields one header set carries.
type fields struct {
	id   uuid.UUID
	typ  string
	at   time.Time
	saga string
}

// FromRecord rebuilds an envelope from a Kafka record's key, value and
// headers, and validates it. Any failure is a *DecodeError naming the record
// part at fault and wrapping one of the package's Err values: a missing id
// header wraps ErrMissingHeader, an unparsable one, or one whose version is
// neither 7 nor 5, ErrInvalidID.
//
// The record may carry the idem headers, the CloudEvents headers, or both
// (see HeaderFormat); it is read as a CloudEvent when it has a
// ce_specversion header. Each set present must be complete:
//
//   - idem: the id, type and occurred-at headers are required, the saga-id
//     header is optional. This set is required when the record is not a
//     CloudEvent.
//   - CloudEvents: ce_specversion must be "1.0" (ErrUnsupportedSpecVersion);
//     ce_id, ce_type and ce_time are required (ce_time is optional in
//     CloudEvents but idem needs the occurrence time), ce_idemsagaid is
//     optional. ce_id follows the rules of the idem id header: a canonical
//     UUID of version 7 (or 5, see StepID), else ErrInvalidID. ce_time may
//     be any RFC 3339 time; it is converted to UTC. ce_source, ce_subject,
//     ce_partitionkey and other "ce_" headers (any case) are neither
//     checked nor kept: the key comes from the record key, and the source
//     names the producer, not the event. A content-type header equal to
//     "application/json" is the CloudEvents datacontenttype and is dropped
//     too; any other value is kept in Envelope.Headers.
//
// A CloudEvent in structured mode (content-type
// application/cloudevents+json, the event in the value) is not read: its
// error wraps ErrMissingHeader and says so.
//
// When both sets are present the idem headers win, but the two must agree
// on ID, type, occurrence time (as an instant) and saga ID, else the error
// wraps ErrHeaderMismatch. Each known header may appear at most once
// (ErrDuplicateHeader). Unknown headers with the "idem-" prefix are ignored;
// other headers go to Envelope.Headers (the last value wins if a name
// repeats), "ce_" ones included when the record is not a CloudEvent. Value
// is copied, so the caller may reuse it.
func FromRecord(key, value []byte, headers []Header) (Envelope, error) {
	var (
		e                             Envelope
		id, typ, at, saga             []byte
		hasID, hasTyp, hasAt, hasSaga bool
		ceHeaders                     []Header
		isCE                          bool
	)
	for _, h := range headers {
		var dst *[]byte
		var seen *bool
		switch h.Key {
		case HeaderEventID:
			dst, seen = &id, &hasID
		case HeaderEventType:
			dst, seen = &typ, &hasTyp
		case HeaderOccurredAt:
			dst, seen = &at, &hasAt
		case HeaderSagaID:
			dst, seen = &saga, &hasSaga
		default:
			if isReserved(h.Key) {
				continue // a newer producer's header; not ours to judge
			}
			if hasCEPrefix(h.Key) {
				// Kept aside until we know whether the record is a CloudEvent.
				ceHeaders = append(ceHeaders, h)
				isCE = isCE || h.Key == HeaderCESpecVersion
				continue
			}
			if e.Headers == nil {
				e.Headers = make(map[string]string)
			}
			e.Headers[h.Key] = string(h.Value)
			continue
		}
		if *seen {
			return Envelope{}, &DecodeError{Field: h.Key, Err: ErrDuplicateHeader}
		}
		*dst, *seen = h.Value, true
	}

	var idem, ce fields
	hasIdem := hasID || hasTyp || hasAt || hasSaga
	if hasIdem || !isCE {
		if !hasID {
			return Envelope{}, &DecodeError{Field: HeaderEventID, Err: missingID(e.Headers[HeaderContentType])}
		}
		var err error
		if idem.id, err = parseID(id); err != nil {
			return Envelope{}, &DecodeError{Field: HeaderEventID, Err: err}
		}
		if !hasTyp {
			return Envelope{}, &DecodeError{Field: HeaderEventType, Err: ErrMissingHeader}
		}
		idem.typ = string(typ)
		if !hasAt {
			return Envelope{}, &DecodeError{Field: HeaderOccurredAt, Err: ErrMissingHeader}
		}
		if idem.at, err = parseTimeBytes(at); err != nil {
			return Envelope{}, &DecodeError{Field: HeaderOccurredAt, Err: err}
		}
		idem.saga = string(saga)
	}
	if isCE {
		var err error
		if ce, err = decodeCE(ceHeaders); err != nil {
			return Envelope{}, err
		}
		if ct, ok := e.Headers[HeaderContentType]; ok && ct == ContentTypeJSON {
			delete(e.Headers, HeaderContentType)
			if len(e.Headers) == 0 {
				e.Headers = nil
			}
		}
	} else {
		for _, h := range ceHeaders {
			if e.Headers == nil {
				e.Headers = make(map[string]string)
			}
			e.Headers[h.Key] = string(h.Value)
		}
	}

	f := idem
	switch {
	case hasIdem && isCE:
		if err := agree(idem, ce); err != nil {
			return Envelope{}, err
		}
	case isCE:
		f = ce
	}
	e.ID, e.Type, e.OccurredAt, e.SagaID = f.id, f.typ, f.at, f.saga
	e.Key = string(key)
	e.Payload = bytes.Clone(value)

	if field, err := e.check(); err != nil {
		if !hasIdem {
			field = ceField(field)
		}
		return Envelope{}, &DecodeError{Field: field, Err: err}
	}
	return e, nil
}

// missingID is the error of a record without the idem ID header, whose
// content-type header is ct: ErrMissingHeader, saying so when ct is the
// CloudEvents structured mode's, which FromRecord does not read (the
// binding's binary mode carries the event in ce_ headers).
func missingID(ct string) error {
	const structured = "application/cloudevents"
	if len(ct) < len(structured) || !strings.EqualFold(ct[:len(structured)], structured) {
		return ErrMissingHeader
	}
	return fmt.Errorf("%w: a CloudEvent in structured mode (content-type %q), which idem does not read: have its producer use the Kafka binding's binary mode (ce_ headers)", ErrMissingHeader, truncate(ct))
}

// decodeCE reads the fields of a CloudEvents record from its "ce_" headers.
func decodeCE(hs []Header) (fields, error) {
	known := [...]string{HeaderCESpecVersion, HeaderCEID, HeaderCEType, HeaderCETime, HeaderCESagaID}
	var (
		vals [len(known)][]byte
		seen [len(known)]bool
	)
	for _, h := range hs {
		i := slices.Index(known[:], h.Key)
		if i < 0 {
			continue // ce_source, ce_subject, another extension: not kept
		}
		if seen[i] {
			return fields{}, &DecodeError{Field: h.Key, Err: ErrDuplicateHeader}
		}
		vals[i], seen[i] = h.Value, true
	}
	var f fields
	if v := string(vals[0]); v != CloudEventsSpecVersion {
		return fields{}, &DecodeError{Field: HeaderCESpecVersion, Err: fmt.Errorf("%w: %q, want %q", ErrUnsupportedSpecVersion, truncate(v), CloudEventsSpecVersion)}
	}
	if !seen[1] {
		return fields{}, &DecodeError{Field: HeaderCEID, Err: ErrMissingHeader}
	}
	var err error
	if f.id, err = parseID(vals[1]); err != nil {
		return fields{}, &DecodeError{Field: HeaderCEID, Err: err}
	}
	if !seen[2] {
		return fields{}, &DecodeError{Field: HeaderCEType, Err: ErrMissingHeader}
	}
	f.typ = string(vals[2])
	if !seen[3] {
		return fields{}, &DecodeError{Field: HeaderCETime, Err: ErrMissingHeader}
	}
	// RFC 3339 allows a lower-case "t" and "z"; Go's layout does not.
	if f.at, err = parseTime(strings.ToUpper(string(vals[3]))); err != nil {
		return fields{}, &DecodeError{Field: HeaderCETime, Err: err}
	}
	f.saga = string(vals[4])
	return f, nil
}

// parseTimeBytes is parseTime(string(b)) without converting b to a string
// (an allocation per record) in the common case: time.Time.UnmarshalText
// accepts a subset of what time.Parse with RFC3339Nano does (both go
// through the same RFC 3339 parser first), with the same result; anything
// else takes parseTime, for the same verdict and error.
func parseTimeBytes(b []byte) (time.Time, error) {
	var t time.Time
	if isRFC3339(b) && t.UnmarshalText(b) == nil {
		if t = t.UTC(); t.Year() >= 0 && t.Year() <= 9999 {
			return t, nil
		}
	}
	return parseTime(string(b))
}

// parseTime parses an RFC 3339 time and returns it in UTC. The UTC year
// must have four digits, so the time can be written back as RFC 3339.
func parseTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: %w", ErrInvalidTime, err)
	}
	if !isRFC3339(s) {
		return time.Time{}, fmt.Errorf("%w: %q is not RFC 3339", ErrInvalidTime, truncate(s))
	}
	t = t.UTC()
	if y := t.Year(); y < 0 || y > 9999 {
		return time.Time{}, fmt.Errorf("%w: %q is in year %d in UTC", ErrInvalidTime, truncate(s), y)
	}
	return t, nil
}

// isRFC3339 reports whether s has the shape of an RFC 3339 date-time in
// upper case: YYYY-MM-DDTHH:MM:SS, an optional fraction of one or more
// digits after a '.', then Z or an offset ±HH:MM with HH at most 23 and MM
// at most 59. time.Parse checks the ranges of the date and time fields but
// is laxer about the rest (go.dev/issue/54580): it takes a one-digit hour,
// a ',' before the fraction, and offsets such as +24:00 or +23:60, so
// parseTime and parseTimeBytes ask this too. It does not allocate.
func isRFC3339[T string | []byte](s T) bool {
	const n = len("2006-01-02T15:04:05")
	if len(s) < n+1 {
		return false
	}
	for i := range n {
		c := s[i]
		switch i {
		case 4, 7:
			if c != '-' {
				return false
			}
		case 10:
			if c != 'T' {
				return false
			}
		case 13, 16:
			if c != ':' {
				return false
			}
		default:
			if !isDigit(c) {
				return false
			}
		}
	}
	i := n
	if s[i] == '.' {
		i++
		start := i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		if i == start {
			return false
		}
	}
	switch z := s[i:]; {
	case len(z) == 1:
		return z[0] == 'Z'
	case len(z) == 6:
		return (z[0] == '+' || z[0] == '-') && z[3] == ':' &&
			isDigit(z[1]) && isDigit(z[2]) && isDigit(z[4]) && isDigit(z[5]) &&
			(z[1] < '2' || z[1] == '2' && z[2] <= '3') && z[4] <= '5'
	}
	return false
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// agree checks that the idem and CloudEvents headers of one record describe
// the same event.
func agree(idem, ce fields) error {
	var field, a, b string
	switch {
	case idem.id != ce.id:
		field, a, b = HeaderCEID, idem.id.String(), ce.id.String()
	case idem.typ != ce.typ:
		field, a, b = HeaderCEType, idem.typ, ce.typ
	case !idem.at.Equal(ce.at):
		field, a, b = HeaderCETime, idem.at.Format(time.RFC3339Nano), ce.at.Format(time.RFC3339Nano)
	case idem.saga != ce.saga:
		field, a, b = HeaderCESagaID, idem.saga, ce.saga
	default:
		return nil
	}
	return &DecodeError{Field: field, Err: fmt.Errorf("%w: %q in the idem header, %q in %s", ErrHeaderMismatch, truncate(a), truncate(b), field)}
}

// ceField maps the idem header name that Envelope.check blames to the
// CloudEvents header the field came from.
func ceField(field string) string {
	switch field {
	case HeaderEventID:
		return HeaderCEID
	case HeaderEventType:
		return HeaderCEType
	case HeaderOccurredAt:
		return HeaderCETime
	}
	return field
}

// parseID accepts only the canonical 36-character form that RecordHeaders
// writes (hex digits in either case), so one ID has one spelling on the wire.
func parseID(b []byte) (uuid.UUID, error) {
	if len(b) != 36 {
		return uuid.Nil, fmt.Errorf("%w: %q is not a canonical UUID", ErrInvalidID, truncate(string(b)))
	}
	id, err := uuid.ParseBytes(b)
	if err != nil {
		return uuid.Nil, fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	if err := checkID(id); err != nil {
		return uuid.Nil, err
	}
	return id, nil
}
