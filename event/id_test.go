package event_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/event"
)

// rfcV7 is the UUIDv7 test vector of RFC 9562 appendix A.6:
// 2022-02-22T19:22:22Z (Unix ms 1645557742000).
var rfcV7 = uuid.MustParse("017f22e2-79b0-7cc3-98c4-dc0c0c07398f")

func assertV7(t *testing.T, id uuid.UUID) {
	t.Helper()
	if id.Version() != 7 {
		t.Errorf("%s: version %d, want 7", id, id.Version())
	}
	if id.Variant() != uuid.RFC4122 {
		t.Errorf("%s: variant %v, want RFC4122", id, id.Variant())
	}
}

func TestTimeOf(t *testing.T) {
	t.Parallel()
	now := time.Now()
	fresh, err := event.NewID()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		id     uuid.UUID
		want   time.Time
		wantOK bool
	}{
		{"rfc 9562 vector", rfcV7, time.Date(2022, 2, 22, 19, 22, 22, 0, time.UTC), true},
		{"fresh v7", fresh, now.UTC().Truncate(time.Millisecond), true},
		{"v4", uuid.MustParse("a4fdb2df-568e-471f-ba88-ff4dba30f6e4"), time.Time{}, false},
		{"v5 step fallback", event.StepID("order-42", "reserve"), time.Time{}, false},
		{"nil", uuid.Nil, time.Time{}, false},
		{"v7 bits, wrong variant", uuid.MustParse("017f22e2-79b0-7cc3-18c4-dc0c0c07398f"), time.Time{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := event.TimeOf(tt.id)
			if ok != tt.wantOK {
				t.Fatalf("ok = %v, want %v", ok, tt.wantOK)
			}
			if tt.name == "fresh v7" {
				// The clock may tick between time.Now and NewID.
				if d := got.Sub(tt.want); d < 0 || d > time.Second {
					t.Errorf("TimeOf = %v, want about %v", got, tt.want)
				}
				return
			}
			if !got.Equal(tt.want) {
				t.Errorf("TimeOf = %v, want %v", got, tt.want)
			}
			if ok && got.Location() != time.UTC {
				t.Errorf("location %v, want UTC", got.Location())
			}
		})
	}
}

// TestGoldenIDs pins the algorithm: deterministic IDs are part of the wire
// contract, because a saga step retried by a newer binary must re-emit the ID
// an older binary emitted. If this test fails, the change breaks
// deduplication across a deploy.
func TestGoldenIDs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		got  uuid.UUID
		want string
	}{
		{"DerivedID", event.DerivedID(rfcV7, "PaymentRequested"), "017f22e2-79b0-793a-9fd6-e7158c8df606"},
		{"StepID v7 saga", event.StepID(rfcV7.String(), "reserve-stock"), "017f22e2-79b0-73ad-807d-0827269944a8"},
		{"StepID text saga", event.StepID("order-42", "reserve-stock"), "dd861239-80aa-5cb6-b1b2-4d82ccfd2ae7"},
		{"StepIDAt", event.StepIDAt("order-42", "reserve-stock", time.Date(2024, 1, 2, 3, 4, 5, 6e6, time.UTC)), "018cc820-d88e-7b15-9220-640a0d1cb2d6"},
	}
	for _, tt := range tests {
		if tt.got.String() != tt.want {
			t.Errorf("%s = %s, want %s", tt.name, tt.got, tt.want)
		}
	}
}

func TestDerivedID(t *testing.T) {
	t.Parallel()
	parent, err := event.NewID()
	if err != nil {
		t.Fatal(err)
	}
	other, err := event.NewID()
	if err != nil {
		t.Fatal(err)
	}
	a := event.DerivedID(parent, "PaymentRequested")
	assertV7(t, a)
	if b := event.DerivedID(parent, "PaymentRequested"); b != a {
		t.Errorf("not deterministic: %s != %s", a, b)
	}
	if b := event.DerivedID(parent, "StockReserved"); b == a {
		t.Errorf("different names gave the same id %s", a)
	}
	if b := event.DerivedID(other, "PaymentRequested"); b == a {
		t.Errorf("different parents gave the same id %s", a)
	}
	if a == parent {
		t.Errorf("derived id equals its parent")
	}
	pt, _ := event.TimeOf(parent)
	at, ok := event.TimeOf(a)
	if !ok || !at.Equal(pt) {
		t.Errorf("TimeOf(derived) = %v, %v; want parent's %v", at, ok, pt)
	}
	// Derivation chains stay v7 and keep the root's time.
	grand := event.DerivedID(a, "PaymentRequested")
	assertV7(t, grand)
	if grand == a {
		t.Errorf("chained derivation returned its input")
	}
	if gt, _ := event.TimeOf(grand); !gt.Equal(pt) {
		t.Errorf("grandchild time %v, want %v", gt, pt)
	}
}

func TestStepIDAt(t *testing.T) {
	t.Parallel()
	start := time.Date(2025, 6, 1, 12, 0, 0, 123456789, time.UTC)
	a := event.StepIDAt("saga-1", "charge", start)
	assertV7(t, a)
	if got, _ := event.TimeOf(a); !got.Equal(start.Truncate(time.Millisecond)) {
		t.Errorf("TimeOf = %v, want %v", got, start.Truncate(time.Millisecond))
	}
	if b := event.StepIDAt("saga-1", "charge", start); b != a {
		t.Errorf("not deterministic")
	}
	if b := event.StepIDAt("saga-1", "refund", start); b == a {
		t.Errorf("different steps collide")
	}
	if b := event.StepIDAt("saga-2", "charge", start); b == a {
		t.Errorf("different sagas collide")
	}
	// Length-prefixed inputs: moving a byte across the boundary changes the ID.
	if event.StepIDAt("ab", "c", start) == event.StepIDAt("a", "bc", start) {
		t.Errorf("ambiguous encoding of (saga, step)")
	}
	// Out-of-range times are clamped, not wrapped.
	if got, _ := event.TimeOf(event.StepIDAt("s", "x", time.Time{})); got.UnixMilli() != 0 {
		t.Errorf("zero time -> %v, want Unix epoch", got)
	}
	far := time.Date(20000, 1, 1, 0, 0, 0, 0, time.UTC)
	if got, _ := event.TimeOf(event.StepIDAt("s", "x", far)); got.UnixMilli() != 1<<48-1 {
		t.Errorf("far future -> %d ms, want max 48-bit", got.UnixMilli())
	}
}

func TestStepID(t *testing.T) {
	t.Parallel()
	sagaUUID, err := event.NewID()
	if err != nil {
		t.Fatal(err)
	}
	saga := sagaUUID.String()
	st, _ := event.TimeOf(sagaUUID)

	t.Run("v7 saga id embeds the saga time", func(t *testing.T) {
		t.Parallel()
		id := event.StepID(saga, "reserve")
		assertV7(t, id)
		if want := event.StepIDAt(saga, "reserve", st); id != want {
			t.Errorf("StepID = %s, want StepIDAt with saga time %s", id, want)
		}
	})
	t.Run("other saga id falls back to v5", func(t *testing.T) {
		t.Parallel()
		id := event.StepID("order-42", "reserve")
		if id.Version() != 5 || id.Variant() != uuid.RFC4122 {
			t.Errorf("%s: version %d variant %v, want 5/RFC4122", id, id.Version(), id.Variant())
		}
		if _, ok := event.TimeOf(id); ok {
			t.Errorf("TimeOf reports a time for a v5 id")
		}
		if event.StepID("order-42", "reserve") != id {
			t.Errorf("not deterministic")
		}
		if event.StepID("ab", "c") == event.StepID("a", "bc") {
			t.Errorf("ambiguous encoding of (saga, step)")
		}
		// A v4 saga id has no time either.
		v4 := uuid.MustParse("a4fdb2df-568e-471f-ba88-ff4dba30f6e4").String()
		if v := event.StepID(v4, "reserve").Version(); v != 5 {
			t.Errorf("v4 saga id: version %d, want 5", v)
		}
	})
	t.Run("distinct steps", func(t *testing.T) {
		t.Parallel()
		seen := map[uuid.UUID]string{}
		for _, s := range []string{"reserve", "charge", "ship", "reserve.compensate", ""} {
			id := event.StepID(saga, s)
			if prev, dup := seen[id]; dup {
				t.Errorf("steps %q and %q share id %s", prev, s, id)
			}
			seen[id] = s
		}
	})
}

func TestNewIDConcurrentUnique(t *testing.T) {
	t.Parallel()
	const n = 100
	ids := make(chan uuid.UUID, n)
	for range n {
		go func() {
			id, err := event.NewID()
			if err != nil {
				t.Error(err)
			}
			ids <- id
		}()
	}
	seen := map[uuid.UUID]bool{}
	for range n {
		id := <-ids
		if seen[id] {
			t.Fatalf("duplicate id %s", id)
		}
		seen[id] = true
	}
}

// The nil UUID has no derived IDs: DerivedID of it is nil, which Validate
// refuses, instead of one ID shared by every event derived from an unset
// parent (an outbox would keep the first and drop the others silently).
func TestDerivedIDOfNil(t *testing.T) {
	t.Parallel()
	if got := event.DerivedID(uuid.Nil, "a"); got != uuid.Nil {
		t.Fatalf("DerivedID(Nil, a) = %s, want Nil", got)
	}
	e, err := event.New("OrderCreated.v1", "k", map[string]int{"a": 1})
	if err != nil {
		t.Fatal(err)
	}
	e.ID = event.DerivedID(uuid.Nil, "a")
	if err := e.Validate(); !errors.Is(err, event.ErrInvalidID) {
		t.Errorf("Validate = %v, want ErrInvalidID", err)
	}
}
