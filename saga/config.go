package saga

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkit/idem/observe"
)

// Config configures a Coordinator. The zero value gives the defaults.
type Config struct {
	// Now is the clock that stamps sagas and steps. Defaults to time.Now.
	Now func() time.Time

	// CompensationAttempts is how many times Compensate runs one
	// compensation (each attempt in its own transaction) before it gives
	// up, marks the saga Failed and returns a *CompensationError.
	// A failure of the database is not an attempt: Compensate returns
	// it at once and the saga stays Compensating (see Compensate); but a
	// statement of the compensation cancelled by statement_timeout or
	// lock_timeout is one.
	// Defaults to 3; at least 1.
	CompensationAttempts int

	// CompensationBackoff is the wait before the second attempt of a
	// compensation; it doubles for every further attempt, up to 30s.
	// Defaults to 100ms.
	CompensationBackoff time.Duration

	// Tracer, if set, traces every step and compensation with an
	// idem.saga.step span (attributes idem.saga.step, idem.saga.step_kind
	// and idem.saga.ran; never the saga's data or a step's result), a child
	// of the context given to the step. Nil (the default) traces nothing.
	Tracer observe.Tracer

	// Logger receives warnings (failed compensation attempts, a saga that
	// could not be marked Failed). Defaults to slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.CompensationAttempts == 0 {
		c.CompensationAttempts = 3
	}
	if c.CompensationBackoff == 0 {
		c.CompensationBackoff = 100 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	if c.CompensationAttempts < 1 {
		return fmt.Errorf("saga: invalid config: CompensationAttempts %d must be at least 1", c.CompensationAttempts)
	}
	if c.CompensationBackoff < 0 || c.CompensationBackoff > maxCompensationBackoff {
		return fmt.Errorf("saga: invalid config: CompensationBackoff %s must be 0..%s", c.CompensationBackoff, maxCompensationBackoff)
	}
	return nil
}
