package outbox

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestOutcomes(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	kinds := func(errs []error) string {
		var b strings.Builder
		for _, err := range errs {
			switch {
			case err == nil:
				b.WriteByte('.')
			case errors.Is(err, ErrSkipped):
				b.WriteByte('s')
			case errors.Is(err, ErrPoison):
				b.WriteByte('P')
			case errors.Is(err, boom):
				b.WriteByte('F')
			default:
				b.WriteByte('?')
			}
		}
		return b.String()
	}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"success", nil, "....."},
		{"plain error: nothing known published", boom, "Fssss"},
		{"prefix", PrefixError(5, 2, boom), "..Fss"},
		{"prefix at the end", PrefixError(5, 4, boom), "....F"},
		{"wrapped", fmt.Errorf("kafka: %w", PrefixError(5, 1, boom)), ".Fsss"},
		{"per event", &PublishError{Errs: []error{nil, boom, nil, fmt.Errorf("%w: too large", ErrPoison), nil}}, ".F.P."},
		// A PublishError of the wrong length says nothing about which event
		// failed: the first is retried (a plain failure), never parked for
		// another event's poison.
		{"wrong length", &PublishError{Errs: []error{nil, boom}}, "?ssss"},
		{"wrong length with poison", &PublishError{Errs: []error{nil, fmt.Errorf("%w: too large", ErrPoison)}}, "?ssss"},
		{"prefix at a negative index", PrefixError(5, -1, boom), "Fssss"},
	} {
		if got := kinds(outcomes(tc.err, 5)); got != tc.want {
			t.Errorf("%s: outcomes = %s; want %s", tc.name, got, tc.want)
		}
	}
}

func TestPublishError(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	pe := &PublishError{Errs: []error{nil, fmt.Errorf("%w: record too large", ErrPoison), boom, fmt.Errorf("%w: %w", ErrSkipped, boom)}}
	err := fmt.Errorf("publisher: %w", pe)
	if !errors.Is(err, ErrPoison) || !errors.Is(err, boom) {
		t.Error("errors.Is does not look through the events' errors")
	}
	if got := err.Error(); !strings.Contains(got, "2 of 4 events failed, first event 1") {
		t.Errorf("Error() = %q", got)
	}
	if got := PrefixError(3, 0, boom).Error(); !strings.Contains(got, "1 of 3 events failed, first event 0: boom") {
		t.Errorf("PrefixError.Error() = %q", got)
	}
}

// A plain error (not a PublishError) wrapping ErrPoison for a batch of
// several events says nothing about which event is poison: the first event
// (an innocent event of another key) is retried, never parked. With one
// event the poison is that event's.
func TestOutcomesPlainPoison(t *testing.T) {
	t.Parallel()
	poison := fmt.Errorf("kafka: %w: record too large", ErrPoison)
	outs := outcomes(poison, 3)
	if errors.Is(outs[0], ErrPoison) {
		t.Errorf("outcomes(plain poison, 3)[0] = %v; the first event must not be parked for an unknown event's poison", outs[0])
	}
	if outs[0] == nil || !strings.Contains(outs[0].Error(), "record too large") {
		t.Errorf("outcomes(plain poison, 3)[0] = %v; want the publisher's message", outs[0])
	}
	if outs := outcomes(poison, 1); !errors.Is(outs[0], ErrPoison) {
		t.Errorf("outcomes(plain poison, 1)[0] = %v; want it poison", outs[0])
	}
}
