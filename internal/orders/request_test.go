package orders

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestDecodeCreate(t *testing.T) {
	t.Parallel()
	item := `{"sku":"A-1","quantity":2}`
	body := func(customer, amount, items string) string {
		return `{"customer_id":` + customer + `,"amount":` + amount + `,"items":` + items + `}`
	}
	many := func(n int) string { return "[" + strings.TrimSuffix(strings.Repeat(item+",", n), ",") + "]" }
	tests := []struct {
		name   string
		body   string
		status int    // 0: valid
		field  string // first invalid field for 422
	}{
		{"valid", body("42", `"19.90"`, "["+item+"]"), 0, ""},
		{"valid, 100 items, largest values", body("9223372036854775807", `"999999999999999.9999"`, many(100)), 0, ""},
		{"valid, sku of 64 characters", body("1", `"1"`, `[{"sku":"`+strings.Repeat("é", 64)+`","quantity":1000}]`), 0, ""},

		{"empty", ``, 400, ""},
		{"array", `[]`, 400, ""},
		{"unknown field", `{"customer_id":1,"amount":"1","items":[` + item + `],"x":1}`, 400, ""},
		{"duplicate field", `{"customer_id":1,"customer_id":2,"amount":"1","items":[` + item + `]}`, 400, ""},
		{"unknown item field", body("1", `"1"`, `[{"sku":"a","quantity":1,"price":"1"}]`), 400, ""},
		{"trailing data", body("1", `"1"`, "["+item+"]") + "{}", 400, ""},
		{"too large", `{"customer_id":"` + strings.Repeat("a", MaxRequestBytes) + `"}`, 413, ""},

		{"missing customer", `{"amount":"1","items":[` + item + `]}`, 422, "customer_id"},
		{"customer zero", body("0", `"1"`, "["+item+"]"), 422, "customer_id"},
		{"customer string", body(`"1"`, `"1"`, "["+item+"]"), 422, "customer_id"},
		{"amount number", body("1", `19.9`, "["+item+"]"), 422, "amount"},
		{"amount 5 decimals", body("1", `"1.00001"`, "["+item+"]"), 422, "amount"},
		{"amount zero", body("1", `"0.0000"`, "["+item+"]"), 422, "amount"},
		{"amount negative", body("1", `"-1"`, "["+item+"]"), 422, "amount"},
		{"amount minus garbage", body("1", `"-abc"`, "["+item+"]"), 422, "amount"},
		{"amount exponent", body("1", `"1e3"`, "["+item+"]"), 422, "amount"},
		{"amount 16 digits", body("1", `"1000000000000000"`, "["+item+"]"), 422, "amount"},
		{"items missing", `{"customer_id":1,"amount":"1"}`, 422, "items"},
		{"items empty", body("1", `"1"`, `[]`), 422, "items"},
		{"items not an array", body("1", `"1"`, `{}`), 422, "items"},
		{"101 items", body("1", `"1"`, many(101)), 422, "items"},
		{"item not an object", body("1", `"1"`, `[1]`), 422, "items[0]"},
		{"sku empty", body("1", `"1"`, `[{"sku":"","quantity":1}]`), 422, "items[0].sku"},
		{"sku too long", body("1", `"1"`, `[{"sku":"`+strings.Repeat("a", 65)+`","quantity":1}]`), 422, "items[0].sku"},
		{"sku control character", body("1", `"1"`, `[{"sku":"a\tb","quantity":1}]`), 422, "items[0].sku"},
		{"sku missing", body("1", `"1"`, `[{"quantity":1}]`), 422, "items[0].sku"},
		{"quantity zero", body("1", `"1"`, `[`+item+`,{"sku":"a","quantity":0}]`), 422, "items[1].quantity"},
		{"quantity 1001", body("1", `"1"`, `[{"sku":"a","quantity":1001}]`), 422, "items[0].quantity"},
		{"quantity fractional", body("1", `"1"`, `[{"sku":"a","quantity":1.5}]`), 422, "items[0].quantity"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o, err := DecodeCreate(strings.NewReader(tt.body))
			if tt.status == 0 {
				if err != nil || o.CustomerID <= 0 || !o.Amount.IsPositive() || len(o.Items) == 0 {
					t.Fatalf("DecodeCreate = %+v, %v", o, err)
				}
				return
			}
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("DecodeCreate = %+v, %v; want a RequestError", o, err)
			}
			if re.Status != tt.status {
				t.Errorf("status %d (%s), want %d", re.Status, re.Detail, tt.status)
			}
			if tt.field != "" && (len(re.Fields) == 0 || re.Fields[0].Field != tt.field) {
				t.Errorf("fields %+v, want %s first", re.Fields, tt.field)
			}
		})
	}
}

// A request body under the size limit with thousands of invalid items gets
// a 422 of bounded size: the items past MaxItems are not parsed, so the
// problem cannot outgrow what the idempotency middleware stores (which
// turned a client's mistake into a 500).
func TestDecodeCreateManyInvalidItems(t *testing.T) {
	t.Parallel()
	body := `{"customer_id":1,"amount":"1","items":[` + strings.TrimSuffix(strings.Repeat("{},", 21_000), ",") + `]}`
	if len(body) >= MaxRequestBytes {
		t.Fatalf("body of %d bytes: not under MaxRequestBytes", len(body))
	}
	_, err := DecodeCreate(strings.NewReader(body))
	var re *RequestError
	if !errors.As(err, &re) || re.Status != 422 {
		t.Fatalf("DecodeCreate: %v; want a 422", err)
	}
	if last := re.Fields[len(re.Fields)-1]; last.Field != "items" || !strings.Contains(last.Detail, "at most 100") {
		t.Errorf("last field error %+v, want items: at most 100", last)
	}
	if n := len(re.Fields); n > 2*MaxItems+1 {
		t.Errorf("%d field errors, want at most %d", n, 2*MaxItems+1)
	}
	if n := len(re.Detail); n > 16<<10 {
		t.Errorf("detail of %d bytes", n)
	}
}

// FuzzDecodeCreate: the decoder never panics, a rejection is a 4xx
// RequestError, and what it accepts is within the table's limits and is
// the text the client sent (no U+FFFD in place of a lone surrogate escape).
func FuzzDecodeCreate(f *testing.F) {
	for _, seed := range []string{
		`{"customer_id":42,"amount":"19.90","items":[{"sku":"A-1","quantity":2}]}`,
		`{"items":[[],{}]}`,
		`{"customer_id":1,"amount":"1","items":[{"sku":"a\ud800","quantity":1}]}`,
		`{"customer_id":1,"amount":"1","items":[{"sku":"\ud83d\ude00\ufffd","quantity":1000}]}`,
		`{"customer_id":9223372036854775807,"amount":"999999999999999.9999","items":[{"sku":"a","quantity":1}]}`,
		`{"customer_id":1,"amount":"1","items":[{"sku":"a","quantity":1,"quantity":2}]}`,
		`{"customer_id":1,"amount":1e2,"items":[null,1,"a",{"sku":1}]} x`,
		`[]`, ``, `{}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		o, err := DecodeCreate(strings.NewReader(body))
		if err != nil {
			var re *RequestError
			if !errors.As(err, &re) || re.Status < 400 || re.Status > 499 {
				t.Fatalf("error %v is not a 4xx RequestError", err)
			}
			return
		}
		if o.CustomerID <= 0 || !o.Amount.IsPositive() || o.Amount.Exponent() < -AmountScale || len(o.Items) < 1 || len(o.Items) > MaxItems {
			t.Errorf("accepted %+v", o)
		}
		sent := strings.Contains(body, "\uFFFD") || strings.Contains(strings.ToLower(body), `\ufffd`)
		for _, it := range o.Items {
			if it.SKU == "" || it.Quantity < 1 || it.Quantity > MaxQuantity {
				t.Errorf("accepted item %+v", it)
			}
			if strings.ContainsRune(it.SKU, utf8.RuneError) && !sent {
				t.Errorf("accepted SKU %q: U+FFFD the body did not hold", it.SKU)
			}
		}
	})
}
