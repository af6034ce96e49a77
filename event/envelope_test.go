package event_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/event"
)

type orderCreated struct {
	OrderID string `json:"orderId"`
	Amount  string `json:"amount"`
}

func TestNew(t *testing.T) {
	t.Parallel()
	before := time.Now().UTC().Truncate(time.Microsecond)
	e, err := event.New("OrderCreated.v1", "order-42", orderCreated{"order-42", "10.5000"})
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now().UTC()

	assertV7(t, e.ID)
	if e.Type != "OrderCreated.v1" || e.Key != "order-42" || e.SagaID != "" || e.Headers != nil {
		t.Errorf("unexpected fields: %+v", e)
	}
	if got, want := string(e.Payload), `{"orderId":"order-42","amount":"10.5000"}`; got != want {
		t.Errorf("Payload = %s, want %s", got, want)
	}
	if e.OccurredAt.Location() != time.UTC {
		t.Errorf("OccurredAt location %v, want UTC", e.OccurredAt.Location())
	}
	if e.OccurredAt.Nanosecond()%1000 != 0 {
		t.Errorf("OccurredAt %v not truncated to microseconds", e.OccurredAt)
	}
	if e.OccurredAt.Before(before) || e.OccurredAt.After(after) {
		t.Errorf("OccurredAt %v outside [%v, %v]", e.OccurredAt, before, after)
	}
	if idt, _ := event.TimeOf(e.ID); idt.Sub(e.OccurredAt).Abs() > time.Second {
		t.Errorf("ID time %v far from OccurredAt %v", idt, e.OccurredAt)
	}
	if err := e.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}

	e2, err := event.New("OrderCreated.v1", "order-42", orderCreated{"order-42", "10.5000"})
	if err != nil {
		t.Fatal(err)
	}
	if e2.ID == e.ID {
		t.Errorf("two operations got the same id")
	}
}

func TestNewPayload(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		payload any
		want    string
		wantErr error // nil: success; errInvalidJSON: any error
	}{
		{"struct", orderCreated{"o", "1"}, `{"orderId":"o","amount":"1"}`, nil},
		{"map", map[string]int{"b": 2, "a": 1}, `{"a":1,"b":2}`, nil},
		{"raw message compacted", json.RawMessage(`{ "a" : 1 }`), `{"a":1}`, nil},
		{"bytes taken as JSON", []byte(`[1, 2]`), `[1,2]`, nil},
		{"nil", nil, `null`, nil},
		{"invalid raw", json.RawMessage(`{`), "", errAny},
		{"invalid bytes", []byte(`not json`), "", errAny},
		{"unencodable", make(chan int), "", errAny},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e, err := event.New("Thing.v1", "k", tt.payload)
			if tt.wantErr != nil {
				if err == nil {
					t.Fatalf("New succeeded with payload %s", e.Payload)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(e.Payload) != tt.want {
				t.Errorf("Payload = %s, want %s", e.Payload, tt.want)
			}
		})
	}
}

var errAny = errors.New("any error")

func TestNewRejectsBadEnvelope(t *testing.T) {
	t.Parallel()
	if _, err := event.New("OrderCreated", "k", 1); !errors.Is(err, event.ErrInvalidType) {
		t.Errorf("unversioned type: err = %v, want ErrInvalidType", err)
	}
	if _, err := event.New("OrderCreated.v1", "", 1); !errors.Is(err, event.ErrEmptyKey) {
		t.Errorf("empty key: err = %v, want ErrEmptyKey", err)
	}
}

// A long value in an error message is cut at a character, not inside
// one: a cut inside showed as \x escapes, as if the value were not UTF-8.
func TestErrorTruncatesAtCharacter(t *testing.T) {
	t.Parallel()
	typ := "Order" + strings.Repeat("€", 30) // 5 + 90 bytes; byte 64 is inside a €
	_, err := event.New(typ, "k", 1)
	if !errors.Is(err, event.ErrInvalidType) {
		t.Fatalf("err = %v, want ErrInvalidType", err)
	}
	want := `"Order` + strings.Repeat("€", 19) + `..."`
	if msg := err.Error(); strings.Contains(msg, `\x`) || !strings.Contains(msg, want) {
		t.Errorf("err = %s, want it to quote %s", msg, want)
	}
}

func validEnvelope(t *testing.T) event.Envelope {
	t.Helper()
	e, err := event.New("OrderCreated.v1", "order-42", map[string]string{"orderId": "order-42"})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		modify func(*event.Envelope)
		want   error
	}{
		{"valid", func(*event.Envelope) {}, nil},
		{"with saga and headers", func(e *event.Envelope) {
			e.SagaID = "saga-1"
			e.Headers = map[string]string{"traceparent": "00-abc", "Tenant": "t1"}
		}, nil},
		{"v5 step id", func(e *event.Envelope) { e.ID = event.StepID("order-42", "charge") }, nil},
		{"derived id", func(e *event.Envelope) { e.ID = event.DerivedID(e.ID, "x") }, nil},
		{"nil id", func(e *event.Envelope) { e.ID = uuid.Nil }, event.ErrInvalidID},
		{"v4 id", func(e *event.Envelope) { e.ID = uuid.New() }, event.ErrInvalidID},
		{"wrong variant", func(e *event.Envelope) { e.ID[8] &= 0x3f }, event.ErrInvalidID},
		{"type with dots and version", func(e *event.Envelope) { e.Type = "payments.Refund_issued-x.v12" }, nil},
		{"type without version", func(e *event.Envelope) { e.Type = "OrderCreated" }, event.ErrInvalidType},
		{"type with empty version", func(e *event.Envelope) { e.Type = "OrderCreated.v" }, event.ErrInvalidType},
		{"type starting with digit", func(e *event.Envelope) { e.Type = "1Order.v1" }, event.ErrInvalidType},
		{"type with space", func(e *event.Envelope) { e.Type = "Order Created.v1" }, event.ErrInvalidType},
		{"type with trailing newline", func(e *event.Envelope) { e.Type = "OrderCreated.v1\n" }, event.ErrInvalidType},
		{"type too long", func(e *event.Envelope) { e.Type = strings.Repeat("a", 253) + ".v1" }, event.ErrInvalidType},
		{"type at max length", func(e *event.Envelope) { e.Type = strings.Repeat("a", 252) + ".v1" }, nil},
		{"empty key", func(e *event.Envelope) { e.Key = "" }, event.ErrEmptyKey},
		{"key at max length", func(e *event.Envelope) { e.Key = strings.Repeat("k", event.MaxKeyBytes) }, nil},
		{"key too long", func(e *event.Envelope) { e.Key = strings.Repeat("k", event.MaxKeyBytes+1) }, event.ErrInvalidKey},
		{"key not UTF-8", func(e *event.Envelope) { e.Key = "k\xff" }, event.ErrInvalidKey},
		{"key with NUL", func(e *event.Envelope) { e.Key = "k\x00" }, event.ErrInvalidKey},
		{"unicode key", func(e *event.Envelope) { e.Key = "заказ-42" }, nil},
		{"binary header value", func(e *event.Envelope) { e.Headers = map[string]string{"sig": "\xff\x00\x01"} }, event.ErrInvalidText},
		{"header value with NUL", func(e *event.Envelope) { e.Headers = map[string]string{"sig": "a\x00"} }, event.ErrInvalidText},
		{"header name not UTF-8", func(e *event.Envelope) { e.Headers = map[string]string{"s\xffg": "a"} }, event.ErrInvalidText},
		{"saga id with NUL", func(e *event.Envelope) { e.SagaID = "s\x00" }, event.ErrInvalidText},
		{"zero time", func(e *event.Envelope) { e.OccurredAt = time.Time{} }, event.ErrInvalidTime},
		{"time in year 58893", func(e *event.Envelope) { e.OccurredAt = time.UnixMilli(1_796_000_000_000 * 1000).UTC() }, event.ErrInvalidTime},
		{"time before year 0", func(e *event.Envelope) { e.OccurredAt = time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC) }, event.ErrInvalidTime},
		{"time in year 9999", func(e *event.Envelope) { e.OccurredAt = time.Date(9999, 12, 31, 23, 0, 0, 0, time.UTC) }, nil},
		{"empty payload", func(e *event.Envelope) { e.Payload = nil }, event.ErrInvalidPayload},
		{"non-JSON payload", func(e *event.Envelope) { e.Payload = []byte("{oops") }, event.ErrInvalidPayload},
		{"reserved header", func(e *event.Envelope) { e.Headers = map[string]string{event.HeaderEventID: "x"} }, event.ErrReservedHeader},
		{"reserved prefix any case", func(e *event.Envelope) { e.Headers = map[string]string{"IDEM-custom": "x"} }, event.ErrReservedHeader},
		{"empty header name", func(e *event.Envelope) { e.Headers = map[string]string{"": "x"} }, event.ErrReservedHeader},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := validEnvelope(t)
			tt.modify(&e)
			err := e.ValidateStorable()
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("Validate = %v, want %v", err, tt.want)
			}
		})
	}
}

// Validate checks what publishing needs; the limits of an outbox (key
// length, text) are ValidateStorable's, so that events an outbox already
// holds (stored before those limits) are still published as they are.
func TestValidateLeavesStorageLimits(t *testing.T) {
	t.Parallel()
	for _, modify := range []func(*event.Envelope){
		func(e *event.Envelope) { e.Key = strings.Repeat("k", event.MaxKeyBytes+1) },
		func(e *event.Envelope) { e.Key = "k\xff" },
		func(e *event.Envelope) { e.Headers = map[string]string{"sig": "\xff\x00"} },
	} {
		e := validEnvelope(t)
		modify(&e)
		if err := e.Validate(); err != nil {
			t.Errorf("Validate(%q, %q) = %v; want nil", e.Key, e.Headers, err)
		}
		if err := e.ValidateStorable(); err == nil {
			t.Errorf("ValidateStorable(%q, %q) = nil; want an error", e.Key, e.Headers)
		}
	}
}
