package payments

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/shopspring/decimal"
	"golang.org/x/text/unicode/norm"

	"github.com/idemkit/idem/internal/apijson"
)

// MaxRequestBytes caps the body of a create request.
const MaxRequestBytes = 64 << 10

// Fields of a create request, in the order errors are reported.
const (
	fieldProvider   = "provider"
	fieldExternalID = "external_payment_id"
	fieldAmount     = "amount"
	fieldCustomerID = "customer_id"
)

var requestFields = []string{fieldProvider, fieldExternalID, fieldAmount, fieldCustomerID}

// FieldError and RequestError are the shared request errors.
type (
	FieldError   = apijson.FieldError
	RequestError = apijson.RequestError
)

var badRequest = apijson.BadRequest

// DecodeCreate reads and validates a create request. It is strict: the body
// must be one JSON object, without unknown or duplicate members and without
// data after it; amount must be a JSON string holding a decimal, customer_id
// a JSON integer. Errors are *RequestError.
func DecodeCreate(r io.Reader) (NewPayment, error) {
	body, rerr := apijson.ReadBody(r, MaxRequestBytes)
	if rerr != nil {
		return NewPayment{}, rerr
	}
	raw, rerr := members(body)
	if rerr != nil {
		return NewPayment{}, rerr
	}
	var (
		p    NewPayment
		errs []FieldError
	)
	check := func(field string, parse func(json.RawMessage) string) {
		v, ok := raw[field]
		if !ok {
			errs = append(errs, FieldError{Field: field, Detail: "is required"})
			return
		}
		if msg := parse(v); msg != "" {
			errs = append(errs, FieldError{Field: field, Detail: msg})
		}
	}
	check(fieldProvider, func(v json.RawMessage) (msg string) {
		p.Provider, msg = parseText(v)
		switch {
		case msg != "":
		case strings.HasPrefix(strings.ToLower(p.Provider), ReservedProviderPrefix):
			msg = "must not start with " + strconv.Quote(ReservedProviderPrefix) + ": reserved for idemd's own payments"
		case strings.ToLower(p.Provider) != p.Provider:
			// "Sber" and "sber" would be two identities under the
			// UNIQUE (provider, external ID): two systems spelling one
			// provider differently would create a second payment for
			// one charge. A provider has one spelling, in lower case.
			msg = `must be in lower case, like "sber"`
		}
		return
	})
	check(fieldExternalID, func(v json.RawMessage) (msg string) { p.ExternalID, msg = parseText(v); return })
	check(fieldAmount, func(v json.RawMessage) (msg string) { p.Amount, msg = parseAmount(v); return })
	check(fieldCustomerID, func(v json.RawMessage) (msg string) { p.CustomerID, msg = parseCustomerID(v); return })
	if len(errs) > 0 {
		details := make([]string, len(errs))
		for i, e := range errs {
			details[i] = e.Field + " " + e.Detail
		}
		return NewPayment{}, &RequestError{Status: http.StatusUnprocessableEntity,
			Detail: strings.Join(details, "; "), Fields: errs}
	}
	return p, nil
}

// members splits a JSON object into its raw members, rejecting anything
// that is not exactly one object with known, distinct member names.
func members(body []byte) (map[string]json.RawMessage, *RequestError) {
	if rerr := apijson.CheckBody(body); rerr != nil {
		return nil, rerr
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	out, rerr := apijson.Object(dec, "the body", requestFields)
	if rerr != nil {
		return nil, rerr
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, badRequest("data after the JSON object")
	}
	return out, nil
}

// isFormat reports whether r is an invisible format character (Unicode
// category Cf).
func isFormat(r rune) bool { return unicode.Is(unicode.Cf, r) }

// parseText validates provider and external_payment_id: each has one
// spelling, so that the UNIQUE (provider, external ID) sees the same
// identity whatever system sent it.
func parseText(v json.RawMessage) (string, string) {
	var s string
	if v[0] != '"' || json.Unmarshal(v, &s) != nil {
		return "", "must be a string"
	}
	switch {
	case apijson.HasLoneSurrogate(v):
		// Read as U+FFFD: "e\ud800" and "e\udbff" would be one
		// identity, a second charge answered with the first payment.
		return "", apijson.DetailLoneSurrogate
	case strings.TrimSpace(s) == "":
		return "", "must not be empty"
	case strings.TrimSpace(s) != s:
		// "sber " and "sber" would be two identities under the UNIQUE
		// (provider, external ID): a second payment for one charge.
		return "", "must not start or end with spaces"
	case utf8.RuneCountInString(s) > MaxTextLen:
		return "", fmt.Sprintf("must be at most %d characters", MaxTextLen)
	case strings.IndexFunc(s, unicode.IsControl) >= 0:
		return "", "must not contain control characters"
	case strings.IndexFunc(s, isFormat) >= 0:
		// Invisible (a zero-width space, a byte order mark, a soft
		// hyphen): "sber\u200b" and "sber" look the same and would be
		// two identities, a second payment for one charge.
		return "", "must not contain invisible format characters (like U+200B, U+FEFF)"
	case !norm.NFC.IsNormalString(s):
		// "e\u0301" and "\u00e9" are one text in two spellings: only
		// the composed one (NFC) is accepted, for the same reason.
		return "", "must be in Unicode normalization form C (NFC, composed characters)"
	}
	return s, ""
}

var amountRe = regexp.MustCompile(`^(-?)([0-9]+)(?:\.([0-9]+))?$`)

// parseAmount validates a decimal amount sent as a JSON string.
func parseAmount(v json.RawMessage) (decimal.Decimal, string) {
	const want = `must be a decimal string like "100.50"`
	var s string
	if v[0] != '"' {
		if v[0] == '-' || (v[0] >= '0' && v[0] <= '9') {
			return decimal.Decimal{}, want + ", not a JSON number (JSON numbers are read as binary floats)"
		}
		return decimal.Decimal{}, want
	}
	if json.Unmarshal(v, &s) != nil {
		return decimal.Decimal{}, want
	}
	m := amountRe.FindStringSubmatch(s)
	if m == nil {
		return decimal.Decimal{}, want
	}
	if len(m[3]) > AmountScale {
		return decimal.Decimal{}, fmt.Sprintf("must have at most %d fractional digits", AmountScale)
	}
	if len(strings.TrimLeft(m[2], "0")) > AmountIntDigits {
		return decimal.Decimal{}, fmt.Sprintf("must have at most %d integer digits", AmountIntDigits)
	}
	d, err := decimal.NewFromString(s)
	if err != nil {
		return decimal.Decimal{}, want
	}
	if m[1] == "-" || !d.IsPositive() {
		return decimal.Decimal{}, "must be greater than 0"
	}
	return d, ""
}

var integerRe = regexp.MustCompile(`^-?[0-9]+$`)

// parseCustomerID validates a positive JSON integer.
func parseCustomerID(v json.RawMessage) (int64, string) {
	const want = "must be a positive JSON integer"
	s := string(v)
	if !integerRe.MatchString(s) {
		if v[0] == '"' {
			return 0, want + ", not a string"
		}
		return 0, want
	}
	n, err := strconv.ParseInt(s, 10, 64)
	switch {
	case err != nil && strings.HasPrefix(s, "-"):
		return 0, want
	case err != nil:
		return 0, fmt.Sprintf("must be at most %d", int64(1<<63-1))
	case n <= 0:
		return 0, want
	}
	return n, ""
}
