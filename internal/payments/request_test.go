package payments

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

func TestDecodeCreate(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", MaxTextLen)
	tests := []struct {
		name   string
		body   string
		status int    // 0: valid
		field  string // first invalid field for 422
		amount string // for valid bodies
	}{
		{"valid", `{"provider":"sber","external_payment_id":"e1","amount":"100.50","customer_id":42}`, 0, "", "100.5000"},
		{"valid, other order and spaces", " {\"customer_id\": 1, \"amount\": \"0.0001\", \"external_payment_id\": \"e\", \"provider\": \"p\"}\n", 0, "", "0.0001"},
		{"valid, largest amount", `{"provider":"p","external_payment_id":"e","amount":"999999999999999.9999","customer_id":1}`, 0, "", "999999999999999.9999"},
		{"valid, leading zeros", `{"provider":"p","external_payment_id":"e","amount":"000100.5","customer_id":1}`, 0, "", "100.5000"},
		{"valid, 128 characters", `{"provider":"` + long + `","external_payment_id":"e","amount":"1","customer_id":9223372036854775807}`, 0, "", "1.0000"},

		{"empty body", ``, 400, "", ""},
		{"not an object", `[]`, 400, "", ""},
		{"null", `null`, 400, "", ""},
		{"malformed", `{"provider":"p",}`, 400, "", ""},
		{"unterminated", `{"provider":"p"`, 400, "", ""},
		{"unknown field", `{"provider":"p","external_payment_id":"e","amount":"1","customer_id":1,"currency":"RUB"}`, 400, "", ""},
		{"duplicate field", `{"provider":"p","provider":"q","external_payment_id":"e","amount":"1","customer_id":1}`, 400, "", ""},
		{"trailing object", `{"provider":"p","external_payment_id":"e","amount":"1","customer_id":1}{}`, 400, "", ""},
		{"trailing garbage", `{"provider":"p","external_payment_id":"e","amount":"1","customer_id":1} x`, 400, "", ""},
		{"invalid UTF-8", "{\"provider\":\"p\xff\",\"external_payment_id\":\"e\",\"amount\":\"1\",\"customer_id\":1}", 400, "", ""},
		{"too large", `{"provider":"` + strings.Repeat("a", MaxRequestBytes) + `"}`, 413, "", ""},

		{"missing provider", `{"external_payment_id":"e","amount":"1","customer_id":1}`, 422, "provider", ""},
		{"missing external id", `{"provider":"p","amount":"1","customer_id":1}`, 422, "external_payment_id", ""},
		{"missing amount", `{"provider":"p","external_payment_id":"e","customer_id":1}`, 422, "amount", ""},
		{"missing customer", `{"provider":"p","external_payment_id":"e","amount":"1"}`, 422, "customer_id", ""},
		{"empty object", `{}`, 422, "provider", ""},
		{"empty provider", `{"provider":"","external_payment_id":"e","amount":"1","customer_id":1}`, 422, "provider", ""},
		{"blank provider", `{"provider":"  ","external_payment_id":"e","amount":"1","customer_id":1}`, 422, "provider", ""},
		{"provider not a string", `{"provider":1,"external_payment_id":"e","amount":"1","customer_id":1}`, 422, "provider", ""},
		{"provider null", `{"provider":null,"external_payment_id":"e","amount":"1","customer_id":1}`, 422, "provider", ""},
		{"provider too long", `{"provider":"` + long + `x","external_payment_id":"e","amount":"1","customer_id":1}`, 422, "provider", ""},
		{"provider in upper case", `{"provider":"SBER","external_payment_id":"e","amount":"1","customer_id":1}`, 422, "provider", ""},
		{"provider in mixed case", `{"provider":"Sber","external_payment_id":"e","amount":"1","customer_id":1}`, 422, "provider", ""},
		{"provider with a capital non-ASCII letter", `{"provider":"sbér-É","external_payment_id":"e","amount":"1","customer_id":1}`, 422, "provider", ""},
		{"provider with a trailing space", `{"provider":"sber ","external_payment_id":"e","amount":"1","customer_id":1}`, 422, "provider", ""},
		{"external id with a leading space", `{"provider":"p","external_payment_id":" e1","amount":"1","customer_id":1}`, 422, "external_payment_id", ""},
		{"control character", `{"provider":"p\n","external_payment_id":"e","amount":"1","customer_id":1}`, 422, "provider", ""},
		// Invisible characters and another Unicode spelling: "sber\u200b"
		// and "sber", or "e\u0301" (decomposed) and "\u00e9", look the
		// same but are two identities under the UNIQUE (provider,
		// external ID), and would be a second payment for one charge.
		{"provider with a trailing zero-width space", "{\"provider\":\"sber\u200b\",\"external_payment_id\":\"e\",\"amount\":\"1\",\"customer_id\":1}", 422, "provider", ""},
		{"external id with a byte order mark", "{\"provider\":\"p\",\"external_payment_id\":\"\ufeffe1\",\"amount\":\"1\",\"customer_id\":1}", 422, "external_payment_id", ""},
		{"external id with a soft hyphen, escaped", `{"provider":"p","external_payment_id":"ext\u00ad1","amount":"1","customer_id":1}`, 422, "external_payment_id", ""},
		{"external id decomposed (NFD)", "{\"provider\":\"p\",\"external_payment_id\":\"caf\u0065\u0301\",\"amount\":\"1\",\"customer_id\":1}", 422, "external_payment_id", ""},
		{"valid, external id composed (NFC)", "{\"provider\":\"p\",\"external_payment_id\":\"caf\u00e9\",\"amount\":\"1\",\"customer_id\":1}", 0, "", "1.0000"},
		{"external id too long", `{"provider":"p","external_payment_id":"` + long + `x","amount":"1","customer_id":1}`, 422, "external_payment_id", ""},
		{"amount JSON number", `{"provider":"p","external_payment_id":"e","amount":100.5,"customer_id":1}`, 422, "amount", ""},
		{"amount JSON integer", `{"provider":"p","external_payment_id":"e","amount":100,"customer_id":1}`, 422, "amount", ""},
		{"amount 5 decimals", `{"provider":"p","external_payment_id":"e","amount":"1.00001","customer_id":1}`, 422, "amount", ""},
		{"amount zero", `{"provider":"p","external_payment_id":"e","amount":"0.0000","customer_id":1}`, 422, "amount", ""},
		{"amount negative", `{"provider":"p","external_payment_id":"e","amount":"-1","customer_id":1}`, 422, "amount", ""},
		{"amount negative zero", `{"provider":"p","external_payment_id":"e","amount":"-0","customer_id":1}`, 422, "amount", ""},
		{"amount 16 integer digits", `{"provider":"p","external_payment_id":"e","amount":"1000000000000000","customer_id":1}`, 422, "amount", ""},
		{"amount exponent", `{"provider":"p","external_payment_id":"e","amount":"1e3","customer_id":1}`, 422, "amount", ""},
		{"amount plus sign", `{"provider":"p","external_payment_id":"e","amount":"+1","customer_id":1}`, 422, "amount", ""},
		{"amount leading dot", `{"provider":"p","external_payment_id":"e","amount":".5","customer_id":1}`, 422, "amount", ""},
		{"amount trailing dot", `{"provider":"p","external_payment_id":"e","amount":"5.","customer_id":1}`, 422, "amount", ""},
		{"amount with spaces", `{"provider":"p","external_payment_id":"e","amount":" 5","customer_id":1}`, 422, "amount", ""},
		{"amount comma", `{"provider":"p","external_payment_id":"e","amount":"5,00","customer_id":1}`, 422, "amount", ""},
		{"amount NaN", `{"provider":"p","external_payment_id":"e","amount":"NaN","customer_id":1}`, 422, "amount", ""},
		{"amount empty", `{"provider":"p","external_payment_id":"e","amount":"","customer_id":1}`, 422, "amount", ""},
		{"amount null", `{"provider":"p","external_payment_id":"e","amount":null,"customer_id":1}`, 422, "amount", ""},
		{"customer string", `{"provider":"p","external_payment_id":"e","amount":"1","customer_id":"1"}`, 422, "customer_id", ""},
		{"customer fractional", `{"provider":"p","external_payment_id":"e","amount":"1","customer_id":1.5}`, 422, "customer_id", ""},
		{"customer 1.0", `{"provider":"p","external_payment_id":"e","amount":"1","customer_id":1.0}`, 422, "customer_id", ""},
		{"customer exponent", `{"provider":"p","external_payment_id":"e","amount":"1","customer_id":1e3}`, 422, "customer_id", ""},
		{"customer zero", `{"provider":"p","external_payment_id":"e","amount":"1","customer_id":0}`, 422, "customer_id", ""},
		{"customer negative", `{"provider":"p","external_payment_id":"e","amount":"1","customer_id":-1}`, 422, "customer_id", ""},
		{"customer too large", `{"provider":"p","external_payment_id":"e","amount":"1","customer_id":9223372036854775808}`, 422, "customer_id", ""},
		{"customer bool", `{"provider":"p","external_payment_id":"e","amount":"1","customer_id":true}`, 422, "customer_id", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := DecodeCreate(strings.NewReader(tt.body))
			if tt.status == 0 {
				if err != nil {
					t.Fatalf("DecodeCreate: %v", err)
				}
				if got := p.Amount.StringFixed(AmountScale); got != tt.amount {
					t.Errorf("amount %s, want %s", got, tt.amount)
				}
				return
			}
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("DecodeCreate = %+v, %v; want a RequestError", p, err)
			}
			if re.Status != tt.status {
				t.Errorf("status %d (%s), want %d", re.Status, re.Detail, tt.status)
			}
			if tt.field != "" && (len(re.Fields) == 0 || re.Fields[0].Field != tt.field) {
				t.Errorf("fields %+v, want %s first", re.Fields, tt.field)
			}
			if tt.field != "" && !strings.Contains(re.Detail, tt.field) {
				t.Errorf("detail %q does not name %s", re.Detail, tt.field)
			}
		})
	}
}

func TestDecodeCreateReportsEveryField(t *testing.T) {
	t.Parallel()
	_, err := DecodeCreate(strings.NewReader(`{"amount":1.5,"customer_id":"7"}`))
	var re *RequestError
	if !errors.As(err, &re) || len(re.Fields) != 4 {
		t.Fatalf("err %v, want 4 field errors", err)
	}
	for i, f := range []string{"provider", "external_payment_id", "amount", "customer_id"} {
		if re.Fields[i].Field != f {
			t.Errorf("field %d is %s, want %s", i, re.Fields[i].Field, f)
		}
	}
}

// FuzzDecodeCreate: the decoder never panics, a rejection is a 4xx
// RequestError (a 422 names known fields only), and whatever it accepts is
// within the limits of the payment table, in the one spelling of each
// identity the handler allows, and is text the client sent (no U+FFFD a
// decoder put in place of a lone surrogate escape).
func FuzzDecodeCreate(f *testing.F) {
	for _, seed := range []string{
		`{"provider":"sber","external_payment_id":"e1","amount":"100.50","customer_id":42}`,
		`{"provider":"p","external_payment_id":"e","amount":"999999999999999.9999","customer_id":1}`,
		`{"amount":1e400}`,
		`{"provider":"p","external_payment_id":"e\ud800","amount":"1","customer_id":1}`,
		`{"provider":"p","external_payment_id":"e\ud83d\ude00","amount":"1","customer_id":1}`,
		`{"provider":"p","external_payment_id":"e\ufffd","amount":"0.0001","customer_id":9223372036854775807}`,
		`{"provider":"p","external_payment_id":"caf\u00e9","amount":"000100.5","customer_id":1}`,
		"{\"provider\":\"p\",\"external_payment_id\":\"e\u0301\",\"amount\":\"1\",\"customer_id\":1}",
		`{"provider":"Sber","external_payment_id":" e","amount":"-1","customer_id":-1}`,
		`{"provider":"p","external_payment_id":"e","amount":"1","customer_id":1} {}`,
		`{"provider":"p","provider":"q"}`,
		`{"provider":[[[[]]]],"x":1}`,
		`[]`, ``, `null`, `{}`, `{"customer_id":1e2,"amount":"1E2"}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		p, err := DecodeCreate(strings.NewReader(body))
		if err != nil {
			var re *RequestError
			if !errors.As(err, &re) || re.Status < 400 || re.Status > 499 {
				t.Fatalf("error %v is not a 4xx RequestError", err)
			}
			for _, fe := range re.Fields {
				if !slices.Contains(requestFields, fe.Field) || fe.Detail == "" {
					t.Errorf("field error %+v", fe)
				}
			}
			if re.Status == 422 && len(re.Fields) == 0 {
				t.Errorf("422 without field errors: %s", re.Detail)
			}
			return
		}
		if !p.Amount.IsPositive() || p.Amount.Exponent() < -AmountScale || len(p.Amount.Truncate(0).String()) > AmountIntDigits {
			t.Errorf("accepted amount %s", p.Amount)
		}
		if p.CustomerID <= 0 || p.Provider == "" || p.ExternalID == "" {
			t.Errorf("accepted %+v", p)
		}
		if strings.ToLower(p.Provider) != p.Provider || strings.HasPrefix(p.Provider, ReservedProviderPrefix) {
			t.Errorf("accepted provider %q", p.Provider)
		}
		sent := strings.Contains(body, "\uFFFD") || strings.Contains(strings.ToLower(body), `\ufffd`)
		for _, s := range []string{p.Provider, p.ExternalID} {
			if strings.TrimSpace(s) != s || utf8.RuneCountInString(s) > MaxTextLen || !norm.NFC.IsNormalString(s) ||
				strings.IndexFunc(s, func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) }) >= 0 {
				t.Errorf("accepted text %q", s)
			}
			if strings.ContainsRune(s, utf8.RuneError) && !sent {
				t.Errorf("accepted %q: U+FFFD the body did not hold", s)
			}
		}
	})
}
