package idemhttp

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// Realistic request bodies for the request-path benchmarks.
var (
	// benchPayment is a ~300 B payment command.
	benchPayment = []byte(`{"provider":"sber","external_payment_id":"ext-1001","amount":"100.50","currency":"RUB",` +
		`"customer_id":42,"description":"Order #1001: coffee beans, 2 kg","capture":true,` +
		`"return_url":"https://shop.example.com/orders/1001/return",` +
		`"metadata":{"order_id":"ord-1001","channel":"web","ip":"203.0.113.7"}}`)
	// benchOrder is a ~2 KiB order with 20 items.
	benchOrder = orderBody(20)
	// benchLarge is a 64 KiB order.
	benchLarge = largeBody(64 << 10)
	// benchResponse is a ~300 B JSON response.
	benchResponse = []byte(`{"id":"pay-7f3c2a9e-1b4d-4e8a-9c61-2d5f8b0e4a17","status":"pending","provider":"sber",` +
		`"external_payment_id":"ext-1001","amount":"100.50","currency":"RUB","customer_id":42,` +
		`"created_at":"2025-03-14T09:26:53.589Z","confirmation_url":"https://pay.example.com/c/7f3c2a9e"}`)
)

var benchBodies = []struct {
	name string
	body []byte
}{{"payment", benchPayment}, {"order", benchOrder}, {"64KiB", benchLarge}}

// orderBody returns an order with n items, keys in no particular order, as
// clients send them.
func orderBody(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"order_id":"ord-2024-000917","customer_id":42,"currency":"EUR",` +
		`"shipping":{"name":"Ren\u00e9e Dupont","street":"12 rue de la Paix","city":"Paris","zip":"75002","country":"FR"},"items":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"sku":"SKU-%05d","name":"Item %d","qty":%d,"price":"%d.%02d","discount":null,"gift":%t}`,
			1000+i, i, 1+i%3, 5+i*7%40, i*13%100, i%5 == 0)
	}
	b.WriteString(`],"note":"leave at the door","total":"1234.50"}`)
	return []byte(b.String())
}

// largeBody returns an order of at least size bytes.
func largeBody(size int) []byte {
	n := 20
	for len(orderBody(n)) < size {
		n += 20
	}
	return orderBody(n)
}

func BenchmarkFingerprint(b *testing.B) {
	for _, bb := range benchBodies {
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bb.body)))
			for b.Loop() {
				Fingerprint("POST", "/payments?label=a", "application/json", bb.body)
			}
		})
	}
	b.Run("charset", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			Fingerprint("POST", "/payments", "application/json; charset=utf-8", benchPayment)
		}
	})
	b.Run("raw-64KiB", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(benchLarge)))
		for b.Loop() {
			Fingerprint("POST", "/upload", "application/octet-stream", benchLarge)
		}
	})
}

func BenchmarkCanonicalJSON(b *testing.B) {
	for _, bb := range benchBodies {
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bb.body)))
			for b.Loop() {
				if _, err := CanonicalJSON(bb.body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRecorder records a handler's 201 JSON answer, then encodes what
// the middleware stores.
func BenchmarkRecorder(b *testing.B) {
	allow := Config{}.withDefaults().replayHeaders()
	b.ReportAllocs()
	for b.Loop() {
		rec := newRecorder(1 << 20)
		h := rec.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Location", "/payments/pay-7f3c2a9e")
		h.Set("X-Request-Id", "req-1")
		rec.WriteHeader(http.StatusCreated)
		if _, err := rec.Write(benchResponse); err != nil {
			b.Fatal(err)
		}
		rec.seal()
		headers, err := encodeHeaders(rec.header, allow)
		if err != nil || rec.statusCode() != http.StatusCreated || len(headers) == 0 || rec.body.Len() != len(benchResponse) {
			b.Fatal(err)
		}
	}
}

func benchHeader() http.Header {
	h := make(http.Header)
	h.Set("Content-Type", "application/json")
	h.Set("Location", "/payments/pay-7f3c2a9e")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Request-Id", "req-1")
	return h
}

func BenchmarkEncodeHeaders(b *testing.B) {
	h := benchHeader()
	allow := Config{}.withDefaults().replayHeaders()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := encodeHeaders(h, allow); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeHeaders(b *testing.B) {
	stored, err := encodeHeaders(benchHeader(), Config{}.withDefaults().replayHeaders())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		h := make(http.Header)
		if err := decodeHeaders(stored, h); err != nil || len(h) != 3 {
			b.Fatal(err, h)
		}
	}
}

func BenchmarkParseKey(b *testing.B) {
	for _, tt := range []struct{ name, value string }{
		{"bare", "7f3c2a9e-1b4d-4e8a-9c61-2d5f8b0e4a17"},
		{"quoted", `"7f3c2a9e-1b4d-4e8a-9c61-2d5f8b0e4a17"`},
	} {
		b.Run(tt.name, func(b *testing.B) {
			h := http.Header{KeyHeader: {tt.value}}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ParseKey(h); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDefaultScope(b *testing.B) {
	r, err := http.NewRequest("POST", "/payments", nil)
	if err != nil {
		b.Fatal(err)
	}
	r.Header.Set("Authorization", "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjbGllbnQtNDIifQ.c2lnbmF0dXJl")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DefaultScope(r); err != nil {
			b.Fatal(err)
		}
	}
}
