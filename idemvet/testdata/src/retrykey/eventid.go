package retrykey

import (
	"context"
	"encoding/json"
	"time"

	"github.com/google/uuid"
	"github.com/idemkit/idem/event"
	"github.com/twmb/franz-go/pkg/kgo"
)

// An event whose ID is made on every attempt of the loop that publishes
// it: every retry is a new event to the consumers' dedup, even with a
// UUIDv7.

type orderPlaced struct {
	EventID string `json:"event_id"`
	OrderID string `json:"order_id"`
}

func publishOrder(ctx context.Context, cl *kgo.Client, orderID string) error {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		evt := orderPlaced{EventID: uuid.Must(uuid.NewV7()).String(), OrderID: orderID} // want "idempotency key created inside a retry loop"
		b, _ := json.Marshal(evt)
		if err = cl.ProduceSync(ctx, &kgo.Record{Topic: "orders", Value: b}).FirstErr(); err == nil {
			return nil
		}
		time.Sleep(time.Second)
	}
	return err
}

func publishEnvelope(ctx context.Context, cl *kgo.Client, payload []byte) error {
	for {
		var e event.Envelope
		e.ID, _ = uuid.NewV7() // want "idempotency key created inside a retry loop"
		e.Payload = payload
		b, _ := json.Marshal(e)
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: b}).FirstErr(); err == nil {
			return nil
		}
		time.Sleep(time.Second)
	}
}

// Not reported: the ID made once, before the loop, and a per-attempt
// trace ID beside it.

type traced struct {
	EventID string
	TraceID string
}

func publishOnce(ctx context.Context, cl *kgo.Client) error {
	id := uuid.Must(uuid.NewV7()).String()
	for {
		evt := traced{EventID: id, TraceID: uuid.NewString()}
		b, _ := json.Marshal(evt)
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: b}).FirstErr(); err == nil {
			return nil
		}
		time.Sleep(time.Second)
	}
}
