package idemkafka

import (
	"testing"
	"time"

	"github.com/idemkit/idem/event"
)

// BenchmarkEnvelope decodes a record as the consumer does for every polled
// record (idem headers, one extra header, a small JSON payload).
func BenchmarkEnvelope(b *testing.B) {
	e, err := event.New("payment.captured.v1", "acct-42", []byte(`{"account":"acct-42","amount":1234}`))
	if err != nil {
		b.Fatal(err)
	}
	e.OccurredAt = time.Date(2026, 12, 4, 14, 0, 0, 123456000, time.UTC)
	e.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	r := Record("payments", e)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Envelope(r); err != nil {
			b.Fatal(err)
		}
	}
}
