package orders

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

	"github.com/idemkit/idem/internal/apijson"
)

// MaxRequestBytes bounds the body of POST /v1/orders.
const MaxRequestBytes = 64 << 10

// FieldError and RequestError are the shared request errors.
type (
	FieldError   = apijson.FieldError
	RequestError = apijson.RequestError
)

var badRequest = apijson.BadRequest

// DecodeCreate reads and validates the body of POST /v1/orders:
//
//	{"customer_id":42,"amount":"19.90","items":[{"sku":"A-1","quantity":2}]}
//
// Unknown and duplicate fields and trailing data are 400; every invalid
// field is reported in one 422.
func DecodeCreate(r io.Reader) (NewOrder, error) {
	body, rerr := apijson.ReadBody(r, MaxRequestBytes)
	if rerr != nil {
		return NewOrder{}, rerr
	}
	if rerr := apijson.CheckBody(body); rerr != nil {
		return NewOrder{}, rerr
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	raw, rerr := apijson.Object(dec, "the body", []string{"customer_id", "amount", "items"})
	if rerr != nil {
		return NewOrder{}, rerr
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return NewOrder{}, badRequest("data after the JSON object")
	}
	var (
		o    NewOrder
		errs []FieldError
	)
	add := func(field, msg string) {
		if msg != "" {
			errs = append(errs, FieldError{Field: field, Detail: msg})
		}
	}
	required := func(field string) (json.RawMessage, bool) {
		v, ok := raw[field]
		if !ok {
			add(field, "is required")
		}
		return v, ok
	}
	if v, ok := required("customer_id"); ok {
		var msg string
		o.CustomerID, msg = parsePositive(v, 1<<63-1)
		add("customer_id", msg)
	}
	if v, ok := required("amount"); ok {
		var msg string
		o.Amount, msg = parseAmount(v)
		add("amount", msg)
	}
	if v, ok := required("items"); ok {
		var rerr *RequestError
		o.Items, rerr = parseItems(v, add)
		if rerr != nil {
			return NewOrder{}, rerr
		}
	}
	if len(errs) > 0 {
		details := make([]string, len(errs))
		for i, e := range errs {
			details[i] = e.Field + " " + e.Detail
		}
		return NewOrder{}, &RequestError{Status: http.StatusUnprocessableEntity,
			Detail: strings.Join(details, "; "), Fields: errs}
	}
	return o, nil
}

func parseItems(v json.RawMessage, add func(field, msg string)) ([]Item, *RequestError) {
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	if tok, _ := dec.Token(); tok != json.Delim('[') { // v is valid JSON: only its kind can be wrong
		add("items", "must be a JSON array")
		return nil, nil
	}
	var items []Item
	for i := 0; dec.More(); i++ {
		if i == MaxItems {
			// Not one more: each item can add two field errors, and the
			// problem of a huge array would outgrow what the middleware
			// stores (a 500 for a client's mistake).
			add("items", fmt.Sprintf("must have at most %d items", MaxItems))
			return nil, nil
		}
		field := "items[" + strconv.Itoa(i) + "]"
		raw, rerr := apijson.Object(dec, field, []string{"sku", "quantity"})
		if rerr != nil {
			if strings.HasPrefix(rerr.Detail, field+" must be") {
				add(field, "must be a JSON object")
				return nil, nil
			}
			return nil, rerr
		}
		var it Item
		if s, ok := raw["sku"]; !ok {
			add(field+".sku", "is required")
		} else {
			var msg string
			it.SKU, msg = parseSKU(s)
			add(field+".sku", msg)
		}
		if q, ok := raw["quantity"]; !ok {
			add(field+".quantity", "is required")
		} else {
			n, msg := parsePositive(q, MaxQuantity)
			it.Quantity = int(n)
			add(field+".quantity", msg)
		}
		items = append(items, it)
	}
	if len(items) == 0 {
		add("items", "must have at least 1 item")
	}
	return items, nil
}

func parseSKU(v json.RawMessage) (string, string) {
	var s string
	if v[0] != '"' || json.Unmarshal(v, &s) != nil {
		return "", "must be a string"
	}
	switch n := utf8.RuneCountInString(s); {
	case apijson.HasLoneSurrogate(v): // read as U+FFFD: not what was sent
		return "", apijson.DetailLoneSurrogate
	case n == 0:
		return "", "must not be empty"
	case n > MaxSKULen:
		return "", fmt.Sprintf("must be at most %d characters", MaxSKULen)
	case strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0:
		return "", "must contain printable characters only"
	}
	return s, ""
}

var (
	amountRe  = regexp.MustCompile(`^([0-9]+)(?:\.([0-9]+))?$`)
	integerRe = regexp.MustCompile(`^-?[0-9]+$`)
)

func parseAmount(v json.RawMessage) (decimal.Decimal, string) {
	const want = `must be a decimal string like "19.90"`
	var s string
	if v[0] != '"' || json.Unmarshal(v, &s) != nil {
		if v[0] == '-' || (v[0] >= '0' && v[0] <= '9') {
			return decimal.Decimal{}, want + ", not a JSON number"
		}
		return decimal.Decimal{}, want
	}
	m := amountRe.FindStringSubmatch(s)
	if m == nil {
		if strings.HasPrefix(s, "-") && amountRe.MatchString(s[1:]) {
			return decimal.Decimal{}, "must be greater than 0"
		}
		return decimal.Decimal{}, want
	}
	if len(m[2]) > AmountScale {
		return decimal.Decimal{}, fmt.Sprintf("must have at most %d fractional digits", AmountScale)
	}
	if len(strings.TrimLeft(m[1], "0")) > AmountIntDigits {
		return decimal.Decimal{}, fmt.Sprintf("must have at most %d integer digits", AmountIntDigits)
	}
	d, err := decimal.NewFromString(s)
	if err != nil {
		return decimal.Decimal{}, want
	}
	if !d.IsPositive() {
		return decimal.Decimal{}, "must be greater than 0"
	}
	return d, ""
}

// parsePositive reads a JSON integer from 1 to max.
func parsePositive(v json.RawMessage, max int64) (int64, string) {
	want := fmt.Sprintf("must be a JSON integer from 1 to %d", max)
	s := string(v)
	if !integerRe.MatchString(s) {
		if v[0] == '"' {
			return 0, want + ", not a string"
		}
		return 0, want
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 || n > max {
		return 0, want
	}
	return n, ""
}
