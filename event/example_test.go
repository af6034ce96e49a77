package event_test

import (
	"fmt"
	"time"

	"github.com/idemkit/idem/event"
)

// New is called once per business operation, inside the transaction that
// performs it; the envelope is stored in the outbox and published as it is.
func ExampleNew() {
	type OrderCreated struct {
		OrderID string `json:"orderId"`
		Amount  string `json:"amount"`
	}
	e, err := event.New("OrderCreated.v1", "order-42", OrderCreated{OrderID: "order-42", Amount: "99.9000"})
	if err != nil {
		panic(err)
	}
	// outbox.EnqueueTx(ctx, tx, e) would go here.

	fmt.Println(e.Type, e.Key, string(e.Payload))
	fmt.Println("UUID version:", e.ID.Version())
	idTime, _ := event.TimeOf(e.ID)
	fmt.Println("ID time within 1s of OccurredAt:", idTime.Sub(e.OccurredAt).Abs() < time.Second)
	for _, h := range e.RecordHeaders()[:2] {
		fmt.Println("header", h.Key)
	}
	// Output:
	// OrderCreated.v1 order-42 {"orderId":"order-42","amount":"99.9000"}
	// UUID version: VERSION_7
	// ID time within 1s of OccurredAt: true
	// header idem-event-id
	// header idem-event-type
}

// A saga step retried after a crash computes the same ID as its first run,
// so the event it re-emits is deduplicated downstream.
func ExampleStepID() {
	sagaID := "017f22e2-79b0-7cc3-98c4-dc0c0c07398f" // a UUIDv7, from uuid.NewV7 when the saga started

	first := event.StepID(sagaID, "reserve-stock")
	retry := event.StepID(sagaID, "reserve-stock")
	next := event.StepID(sagaID, "charge-payment")

	fmt.Println(first)
	fmt.Println("retry reuses it:", first == retry)
	fmt.Println("next step differs:", first != next)
	t, ok := event.TimeOf(first)
	fmt.Println("embeds saga start:", t, ok)

	// A saga ID that is not a UUIDv7 has no time: the ID is a UUIDv5.
	fmt.Println(event.StepID("order-42", "reserve-stock").Version())
	// Output:
	// 017f22e2-79b0-73ad-807d-0827269944a8
	// retry reuses it: true
	// next step differs: true
	// embeds saga start: 2022-02-22 19:22:22 +0000 UTC true
	// VERSION_5
}

// An event emitted while handling another one derives its ID from its cause.
func ExampleDerivedID() {
	orderCreated := event.Envelope{ID: rfcV7}
	id := event.DerivedID(orderCreated.ID, "PaymentRequested")
	fmt.Println(id)
	fmt.Println(id == event.DerivedID(orderCreated.ID, "PaymentRequested"))
	// Output:
	// 017f22e2-79b0-793a-9fd6-e7158c8df606
	// true
}

// A publisher that must interoperate with CloudEvents consumers (Java,
// Knative, ...) writes the CloudEvents Kafka binding's binary-mode headers;
// FromRecord reads them back, as it reads idem's own headers.
func ExampleEnvelope_RecordHeadersWith() {
	e := event.Envelope{
		ID:         rfcV7,
		Type:       "OrderCreated.v1",
		Key:        "order-42",
		SagaID:     "checkout-9",
		OccurredAt: time.Date(2022, 2, 22, 19, 22, 22, 500000000, time.UTC),
		Payload:    []byte(`{"orderId":"order-42"}`),
	}
	hs, err := e.RecordHeadersWith(event.HeaderOptions{Format: event.HeaderFormatCloudEvents, Source: "/orders-service"})
	if err != nil {
		panic(err)
	}
	for _, h := range hs {
		fmt.Printf("%s: %s\n", h.Key, h.Value)
	}

	back, err := event.FromRecord(e.RecordKey(), e.Payload, hs)
	if err != nil {
		panic(err)
	}
	fmt.Println(back.ID == e.ID, back.Type, back.Key, back.SagaID, back.OccurredAt)
	// Output:
	// ce_specversion: 1.0
	// ce_id: 017f22e2-79b0-7cc3-98c4-dc0c0c07398f
	// ce_source: /orders-service
	// ce_type: OrderCreated.v1
	// ce_subject: order-42
	// ce_time: 2022-02-22T19:22:22.5Z
	// ce_partitionkey: order-42
	// ce_idemsagaid: checkout-9
	// content-type: application/json
	// true OrderCreated.v1 order-42 checkout-9 2022-02-22 19:22:22.5 +0000 UTC
}
