package app_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/orders"
	"github.com/idemkit/idem/internal/payments"
	"github.com/idemkit/idem/problem"
)

// contractCase is one request a client integrating against idemd may send,
// and what it must get.
type contractCase struct {
	name         string
	method, path string
	// contentType is sent when not empty ("-" sends none with a body).
	contentType string
	body        string
	header      map[string]string
	// noKey sends no Idempotency-Key (every POST gets one otherwise).
	noKey  bool
	status int
	// typ is the problem type of a 4xx ("" for about:blank).
	typ   string
	allow string // the Allow header of a 405
	field string // the first errors[].field of a 422
	// mention is a text the problem's detail must hold: what the client
	// must change.
	mention string
}

func payment(provider, ext, amount, customer string) string {
	return `{"provider":` + provider + `,"external_payment_id":` + ext + `,"amount":` + amount + `,"customer_id":` + customer + `}`
}

func order(customer, amount, items string) string {
	return `{"customer_id":` + customer + `,"amount":` + amount + `,"items":` + items + `}`
}

// with returns c whose detail must mention s.
func with(c contractCase, s string) contractCase {
	c.mention = s
	return c
}

func contractCases() []contractCase {
	const (
		v   = problem.TypeValidation
		pay = "/v1/payments"
		ord = "/v1/orders"
	)
	p := func(name, body string, status int, field string) contractCase {
		typ := v
		if status < 400 {
			typ = ""
		}
		if status == http.StatusConflict {
			typ = problem.TypeConflict
		}
		return contractCase{name: "payment " + name, method: http.MethodPost, path: pay, contentType: "application/json",
			body: body, status: status, typ: typ, field: field}
	}
	amount := func(a string) string { return payment(`"sber"`, `"amount-test"`, a, `1`) }
	customer := func(c string) string { return payment(`"sber"`, `"customer-test"`, `"1"`, c) }
	text := func(s string) string { return payment(`"sber"`, s, `"1"`, `1`) }
	o := func(name, body string, status int, field string) contractCase {
		c := p(name, body, status, field)
		c.name, c.path = "order "+name, ord
		return c
	}
	item := func(it string) string { return order(`1`, `"1"`, `[`+it+`]`) }
	cases := []contractCase{
		// Valid requests first: their IDs are the same on both stores.
		p("valid", payment(`"sber"`, `"ext-1"`, `"100.50"`, `42`), 201, ""),
		p("valid, largest values", payment(`"sber"`, `"ext-2"`, `"999999999999999.9999"`, `9223372036854775807`), 201, ""),
		p("valid, charset=utf-8", payment(`"sber"`, `"ext-3"`, `"0.0001"`, `1`), 201, ""),
		p("same payment, other key", payment(`"sber"`, `"ext-1"`, `"100.5000"`, `42`), 200, ""),
		p("same identity, other amount", payment(`"sber"`, `"ext-1"`, `"100.51"`, `42`), 409, ""),
		o("valid", order(`42`, `"19.90"`, `[{"sku":"A-1","quantity":2}]`), 201, ""),

		// Content-Type and Content-Encoding: 415 before the key is claimed.
		{name: "no Content-Type", method: http.MethodPost, path: pay, contentType: "-", body: text(`"e"`), status: 415},
		{name: "text/plain", method: http.MethodPost, path: pay, contentType: "text/plain", body: text(`"e"`), status: 415},
		{name: "form", method: http.MethodPost, path: ord, contentType: "application/x-www-form-urlencoded", body: "a=1", status: 415},
		{name: "malformed media type", method: http.MethodPost, path: pay, contentType: "application/json;;", body: text(`"e"`), status: 415},
		{name: "latin-1", method: http.MethodPost, path: ord, contentType: "application/json; charset=iso-8859-1", body: "{}", status: 415},
		{name: "gzip", method: http.MethodPost, path: pay, header: map[string]string{"Content-Encoding": "gzip"}, body: text(`"e"`), status: 415},
		{name: "empty body, no Content-Type", method: http.MethodPost, path: ord, contentType: "-", status: 415},

		// Idempotency-Key and credentials.
		{name: "no key", method: http.MethodPost, path: pay, body: text(`"e"`), noKey: true, status: 400, typ: problem.TypeKeyMissing},
		{name: "malformed key", method: http.MethodPost, path: ord, header: map[string]string{"Idempotency-Key": "a b"}, body: "{}", status: 400, typ: problem.TypeKeyMalformed},
		{name: "basic auth", method: http.MethodPost, path: pay, header: map[string]string{"Authorization": "Basic eDp5"}, body: text(`"e"`), status: 401, typ: problem.TypeUnauthenticated},
		{name: "empty bearer", method: http.MethodGet, path: pay + "/1", header: map[string]string{"Authorization": "Bearer "}, status: 401, typ: problem.TypeUnauthenticated},

		// Bodies that are not one JSON object of known members: 400.
		with(p("empty body", ``, 400, ""), "empty"),
		with(p("whitespace", " \n", 400, ""), "empty"),
		p("null", `null`, 400, ""),
		p("array", `[]`, 400, ""),
		p("string", `"x"`, 400, ""),
		p("not JSON", `provider=sber`, 400, ""),
		p("truncated", `{"provider":"sber"`, 400, ""),
		p("trailing comma", `{"provider":"sber",}`, 400, ""),
		p("single quotes", `{'provider':'sber'}`, 400, ""),
		p("trailing garbage", text(`"e"`)+`x`, 400, ""),
		p("second object", text(`"e"`)+`{}`, 400, ""),
		p("unknown field", `{"provider":"sber","external_payment_id":"e","amount":"1","customer_id":1,"currency":"RUB"}`, 400, ""),
		p("field in other case", `{"Provider":"sber","external_payment_id":"e","amount":"1","customer_id":1}`, 400, ""),
		p("duplicate field", `{"provider":"sber","provider":"sber","external_payment_id":"e","amount":"1","customer_id":1}`, 400, ""),
		p("invalid UTF-8", "{\"provider\":\"sber\",\"external_payment_id\":\"e\xff\",\"amount\":\"1\",\"customer_id\":1}", 400, ""),
		with(p("byte order mark", "\uFEFF"+text(`"e"`), 400, ""), "byte order mark"),
		p("deep nesting", `{"provider":`+strings.Repeat("[", 20_000)+strings.Repeat("]", 20_000)+`}`, 400, ""),
		p("NaN", `{"amount":NaN}`, 400, ""),
		p("leading zero number", customer(`01`), 400, ""),
		with(o("empty body", ``, 400, ""), "empty"),
		with(o("byte order mark", "\uFEFF{}", 400, ""), "byte order mark"),
		o("trailing garbage", order(`1`, `"1"`, `[{"sku":"a","quantity":1}]`)+`]`, 400, ""),
		o("unknown field", `{"customer_id":1,"amount":"1","currency":"EUR","items":[{"sku":"a","quantity":1}]}`, 400, ""),
		o("unknown item field", item(`{"sku":"a","quantity":1,"price":"1"}`), 400, ""),
		o("duplicate item field", item(`{"sku":"a","quantity":1,"quantity":2}`), 400, ""),
		o("invalid UTF-8", "{\"customer_id\":1,\"amount\":\"1\",\"items\":[{\"sku\":\"\xc3\",\"quantity\":1}]}", 400, ""),

		// Too large: the middleware's 413, before the key is claimed.
		{name: "payment too large", method: http.MethodPost, path: pay, body: text(`"` + strings.Repeat("a", payments.MaxRequestBytes) + `"`), status: 413, typ: problem.TypeBodyTooLarge},
		{name: "order too large", method: http.MethodPost, path: ord, body: item(`{"sku":"` + strings.Repeat("a", orders.MaxRequestBytes) + `"}`), status: 413, typ: problem.TypeBodyTooLarge},

		// Missing fields and wrong types: 422 naming every field.
		p("empty object", `{}`, 422, "provider"),
		p("missing amount", `{"provider":"sber","external_payment_id":"e","customer_id":1}`, 422, "amount"),
		p("provider number", payment(`1`, `"e"`, `"1"`, `1`), 422, "provider"),
		p("provider null", payment(`null`, `"e"`, `"1"`, `1`), 422, "provider"),
		p("external id object", text(`{}`), 422, "external_payment_id"),
		p("amount number", amount(`100.5`), 422, "amount"),
		p("amount exponent number", amount(`1e2`), 422, "amount"),
		p("amount huge exponent", amount(`1e999999999`), 422, "amount"),
		p("amount bool", amount(`true`), 422, "amount"),
		p("amount null", amount(`null`), 422, "amount"),
		p("customer string", customer(`"1"`), 422, "customer_id"),
		p("customer fraction", customer(`1.5`), 422, "customer_id"),
		p("customer 1.0", customer(`1.0`), 422, "customer_id"),
		p("customer exponent", customer(`1e2`), 422, "customer_id"),
		p("customer zero", customer(`0`), 422, "customer_id"),
		p("customer minus zero", customer(`-0`), 422, "customer_id"),
		p("customer negative", customer(`-1`), 422, "customer_id"),
		p("customer over int64", customer(`9223372036854775808`), 422, "customer_id"),
		p("customer far over int64", customer(`-99999999999999999999999`), 422, "customer_id"),

		// Amounts: a positive decimal string of at most 15+4 digits.
		p("amount empty", amount(`""`), 422, "amount"),
		p("amount zero", amount(`"0"`), 422, "amount"),
		p("amount zero, 4 decimals", amount(`"0.0000"`), 422, "amount"),
		p("amount negative", amount(`"-1.00"`), 422, "amount"),
		p("amount minus zero", amount(`"-0"`), 422, "amount"),
		p("amount 5 decimals", amount(`"1.00001"`), 422, "amount"),
		p("amount 5 decimals, zero", amount(`"1.00000"`), 422, "amount"),
		p("amount 16 digits", amount(`"1000000000000000"`), 422, "amount"),
		p("amount far over int64", amount(`"99999999999999999999999999"`), 422, "amount"),
		p("amount exponent", amount(`"1e2"`), 422, "amount"),
		p("amount exponent upper", amount(`"1E2"`), 422, "amount"),
		p("amount plus", amount(`"+1"`), 422, "amount"),
		p("amount spaces", amount(`" 1"`), 422, "amount"),
		p("amount trailing dot", amount(`"1."`), 422, "amount"),
		p("amount leading dot", amount(`".5"`), 422, "amount"),
		p("amount comma", amount(`"1,5"`), 422, "amount"),
		p("amount hex", amount(`"0x10"`), 422, "amount"),
		p("amount NaN", amount(`"NaN"`), 422, "amount"),
		p("amount Infinity", amount(`"Infinity"`), 422, "amount"),
		p("amount full-width digits", amount(`"１"`), 422, "amount"),
		p("amount with currency", amount(`"1 RUB"`), 422, "amount"),

		// Identities: one spelling each.
		p("provider empty", payment(`""`, `"e"`, `"1"`, `1`), 422, "provider"),
		p("provider upper case", payment(`"Sber"`, `"e"`, `"1"`, `1`), 422, "provider"),
		p("provider reserved", payment(`"idemd-x"`, `"e"`, `"1"`, `1`), 422, "provider"),
		p("provider too long", payment(`"`+strings.Repeat("a", payments.MaxTextLen+1)+`"`, `"e"`, `"1"`, `1`), 422, "provider"),
		p("external id too long", text(`"`+strings.Repeat("é", payments.MaxTextLen+1)+`"`), 422, "external_payment_id"),
		p("external id spaces", text(`" e"`), 422, "external_payment_id"),
		p("external id blank", text(`"   "`), 422, "external_payment_id"),
		p("external id control", text(`"e\u0000"`), 422, "external_payment_id"),
		p("external id zero-width space", text(`"e\u200b"`), 422, "external_payment_id"),
		p("external id decomposed", text(`"e\u0301"`), 422, "external_payment_id"),
		p("external id lone surrogate", text(`"e\ud800"`), 422, "external_payment_id"),

		// Orders.
		o("empty object", `{}`, 422, "customer_id"),
		o("customer over int64", order(`9223372036854775808`, `"1"`, `[{"sku":"a","quantity":1}]`), 422, "customer_id"),
		o("amount number", order(`1`, `19.9`, `[{"sku":"a","quantity":1}]`), 422, "amount"),
		o("amount negative", order(`1`, `"-19.90"`, `[{"sku":"a","quantity":1}]`), 422, "amount"),
		o("amount 5 decimals", order(`1`, `"19.90001"`, `[{"sku":"a","quantity":1}]`), 422, "amount"),
		o("amount exponent", order(`1`, `"1e3"`, `[{"sku":"a","quantity":1}]`), 422, "amount"),
		o("amount 16 digits", order(`1`, `"1000000000000000"`, `[{"sku":"a","quantity":1}]`), 422, "amount"),
		o("items missing", `{"customer_id":1,"amount":"1"}`, 422, "items"),
		o("items null", order(`1`, `"1"`, `null`), 422, "items"),
		o("items object", order(`1`, `"1"`, `{}`), 422, "items"),
		o("items empty", order(`1`, `"1"`, `[]`), 422, "items"),
		o("too many items", order(`1`, `"1"`, `[`+strings.TrimSuffix(strings.Repeat(`{"sku":"a","quantity":1},`, orders.MaxItems+1), ",")+`]`), 422, "items"),
		o("item null", item(`null`), 422, "items[0]"),
		o("item number", item(`1`), 422, "items[0]"),
		o("sku missing", item(`{"quantity":1}`), 422, "items[0].sku"),
		o("sku number", item(`{"sku":1,"quantity":1}`), 422, "items[0].sku"),
		o("sku empty", item(`{"sku":"","quantity":1}`), 422, "items[0].sku"),
		o("sku too long", item(`{"sku":"`+strings.Repeat("a", orders.MaxSKULen+1)+`","quantity":1}`), 422, "items[0].sku"),
		o("sku control", item(`{"sku":"a\n","quantity":1}`), 422, "items[0].sku"),
		o("sku lone surrogate", item(`{"sku":"a\udc00","quantity":1}`), 422, "items[0].sku"),
		o("quantity zero", item(`{"sku":"a","quantity":0}`), 422, "items[0].quantity"),
		o("quantity over max", item(`{"sku":"a","quantity":1001}`), 422, "items[0].quantity"),
		o("quantity string", item(`{"sku":"a","quantity":"1"}`), 422, "items[0].quantity"),
		o("quantity fraction", item(`{"sku":"a","quantity":1.5}`), 422, "items[0].quantity"),
		o("quantity exponent", item(`{"sku":"a","quantity":1e1}`), 422, "items[0].quantity"),
		o("quantity over int64", item(`{"sku":"a","quantity":99999999999999999999}`), 422, "items[0].quantity"),

		// Reads: 200, or 404 for what is not the canonical spelling of an
		// existing id (ids are positive integers, not UUIDs).
		{name: "get payment", method: http.MethodGet, path: pay + "/1", status: 200},
		{name: "head payment", method: http.MethodHead, path: pay + "/1", status: 200},
		{name: "get order", method: http.MethodGet, path: ord + "/1", status: 200},
		{name: "head order", method: http.MethodHead, path: ord + "/1", status: 200},
		{name: "missing payment", method: http.MethodGet, path: pay + "/999", status: 404},
		{name: "missing order", method: http.MethodGet, path: ord + "/999", status: 404},
		{name: "head missing order", method: http.MethodHead, path: ord + "/999", status: 404},
		{name: "order id zero", method: http.MethodGet, path: ord + "/0", status: 404},
		{name: "order id negative", method: http.MethodGet, path: ord + "/-1", status: 404},
		{name: "order id leading zero", method: http.MethodGet, path: ord + "/01", status: 404},
		{name: "order id plus", method: http.MethodGet, path: ord + "/+1", status: 404},
		{name: "order id over int64", method: http.MethodGet, path: ord + "/9223372036854775808", status: 404},
		{name: "order id UUID", method: http.MethodGet, path: ord + "/0b5f5c32-5d44-4c2a-9d0e-1f2a3b4c5d6e", status: 404},
		{name: "payment id UUID", method: http.MethodGet, path: pay + "/0b5f5c32-5d44-4c2a-9d0e-1f2a3b4c5d6e", status: 404},
		{name: "payment id text", method: http.MethodGet, path: pay + "/abc", status: 404},
		{name: "payment id escaped", method: http.MethodGet, path: pay + "/%00", status: 404},
		{name: "payment id long", method: http.MethodGet, path: pay + "/" + strings.Repeat("9", 2000), status: 404},
		{name: "summary of no orders", method: http.MethodGet, path: "/v1/customers/7/summary", status: 404},
		{name: "summary id text", method: http.MethodGet, path: "/v1/customers/x/summary", status: 404},

		// Routes and methods.
		{name: "root", method: http.MethodGet, path: "/", status: 404},
		{name: "unknown version", method: http.MethodGet, path: "/v2/payments/1", status: 404},
		{name: "trailing slash", method: http.MethodGet, path: pay + "/1/", status: 404},
		{name: "empty id", method: http.MethodGet, path: ord + "/", status: 404},
		{name: "post to trailing slash", method: http.MethodPost, path: pay + "/", body: "{}", status: 404},
		{name: "get collection", method: http.MethodGet, path: pay, status: 405, allow: "POST"},
		{name: "head collection", method: http.MethodHead, path: ord, status: 405, allow: "POST"},
		{name: "put collection", method: http.MethodPut, path: ord, body: "{}", status: 405, allow: "POST"},
		{name: "options collection", method: http.MethodOptions, path: pay, status: 405, allow: "POST"},
		{name: "delete payment", method: http.MethodDelete, path: pay + "/1", status: 405, allow: "GET, HEAD"},
		{name: "patch order", method: http.MethodPatch, path: ord + "/1", body: "{}", status: 405, allow: "GET, HEAD"},
		{name: "post order id", method: http.MethodPost, path: ord + "/1", body: "{}", status: 405, allow: "GET, HEAD"},
		{name: "options order", method: http.MethodOptions, path: ord + "/1", status: 405, allow: "GET, HEAD"},
		{name: "post summary", method: http.MethodPost, path: "/v1/customers/1/summary", body: "{}", status: 405, allow: "GET, HEAD"},
		{name: "trace", method: http.MethodTrace, path: pay, status: 405, allow: "POST"},
		{name: "lower-case method", method: "post", path: pay, body: text(`"e"`), status: 405, allow: "POST"},
	}
	for i := range cases {
		c := &cases[i]
		if c.name == "payment valid, charset=utf-8" {
			c.contentType = "application/json; charset=UTF-8"
		}
		if c.contentType == "" && c.body != "" {
			c.contentType = "application/json"
		}
		if c.contentType == "-" {
			c.contentType = ""
		}
	}
	return cases
}

// documentedTypes returns the problem types docs/problems.md has a section
// for.
func documentedTypes(t *testing.T) map[string]bool {
	t.Helper()
	doc, err := os.ReadFile("../../docs/problems.md")
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]bool{"about:blank": true}
	for _, m := range regexp.MustCompile(`(?m)^## ([a-z-]+)$`).FindAllSubmatch(doc, -1) {
		types[problem.TypeURI(string(m[1]))] = true
	}
	return types
}

var createdAtMember = regexp.MustCompile(`"created_at":"[^"]*"`)

// TestAPIContract sends every kind of request a client integrating against
// idemd may get wrong (and a few right ones) to the real handlers on
// PostgreSQL and on SQLite: each gets its status, a 4xx is never a 500 and
// is application/problem+json with a type docs/problems.md documents (or
// about:blank), a 405 names the allowed methods, a 422 names the field,
// HEAD gets no body, and both stores answer byte for byte the same (but
// created_at).
func TestAPIContract(t *testing.T) {
	t.Parallel()
	cases := contractCases()
	types := documentedTypes(t)
	got := map[string][]response{}
	t.Run("stores", func(t *testing.T) {
		for _, kind := range []string{app.Postgres, app.SQLite} {
			out := make([]response, len(cases))
			got[kind] = out
			t.Run(kind, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, kind)
				for i, c := range cases {
					r := e.contract(i, c)
					out[i] = r
					checkContract(t, c, r, types)
				}
			})
		}
	})
	pg, lite := got[app.Postgres], got[app.SQLite]
	for i, c := range cases {
		if pg[i].status == 0 || lite[i].status == 0 {
			continue // a store failed before this case
		}
		a, b := createdAtMember.ReplaceAll(pg[i].body, nil), createdAtMember.ReplaceAll(lite[i].body, nil)
		if pg[i].status != lite[i].status || !bytes.Equal(a, b) ||
			pg[i].header.Get("Content-Type") != lite[i].header.Get("Content-Type") || pg[i].header.Get("Allow") != lite[i].header.Get("Allow") {
			t.Errorf("%s: PostgreSQL %d %s, SQLite %d %s", c.name, pg[i].status, a, lite[i].status, b)
		}
	}
}

// contract sends case i.
func (e *env) contract(i int, c contractCase) response {
	e.t.Helper()
	req, err := http.NewRequest(c.method, e.srv.URL+c.path, strings.NewReader(c.body))
	if err != nil {
		e.t.Fatal(err)
	}
	if c.contentType != "" {
		req.Header.Set("Content-Type", c.contentType)
	}
	if c.method == http.MethodPost && !c.noKey {
		req.Header.Set("Idempotency-Key", fmt.Sprint("contract-", i))
	}
	for k, v := range c.header {
		req.Header.Set(k, v)
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatalf("%s: %v", c.name, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return response{status: res.StatusCode, header: res.Header, body: b}
}

func checkContract(t *testing.T, c contractCase, r response, types map[string]bool) {
	t.Helper()
	if r.status != c.status {
		t.Errorf("%s: %d %.300s, want %d", c.name, r.status, r.body, c.status)
		return
	}
	if got := r.header.Get("Allow"); got != c.allow {
		t.Errorf("%s: Allow %q, want %q", c.name, got, c.allow)
	}
	if c.method == http.MethodHead {
		if len(r.body) != 0 {
			t.Errorf("%s: HEAD answered a body: %q", c.name, r.body)
		}
		return
	}
	if r.status < 400 {
		if ct := r.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q", c.name, ct)
		}
		return
	}
	if ct := r.header.Get("Content-Type"); ct != problem.MediaType {
		t.Errorf("%s: Content-Type %q, want %s (body %.300s)", c.name, ct, problem.MediaType, r.body)
		return
	}
	if cc := r.header.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("%s: Cache-Control %q, want no-store", c.name, cc)
	}
	m := r.json(t)
	typ, _ := m["type"].(string)
	want := c.typ
	if want == "" {
		want = "about:blank"
	}
	if typ != want {
		t.Errorf("%s: type %q, want %q (%.300s)", c.name, typ, want, r.body)
	}
	if !types[typ] {
		t.Errorf("%s: type %q has no section in docs/problems.md", c.name, typ)
	}
	if status, _ := m["status"].(float64); int(status) != r.status {
		t.Errorf("%s: status member %v, response %d", c.name, m["status"], r.status)
	}
	if title, _ := m["title"].(string); title == "" {
		t.Errorf("%s: no title: %s", c.name, r.body)
	}
	if detail, _ := m["detail"].(string); !strings.Contains(detail, c.mention) {
		t.Errorf("%s: detail %q does not mention %q", c.name, detail, c.mention)
	}
	if c.field != "" {
		errs, _ := m["errors"].([]any)
		var first any
		if len(errs) > 0 {
			first = errs[0].(map[string]any)["field"]
		}
		if first != c.field {
			t.Errorf("%s: errors %v, want %s first", c.name, errs, c.field)
		}
	}
}
