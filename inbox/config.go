package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem/observe"
)

// MaxConsumerLen is the longest Config.Consumer, in bytes.
const MaxConsumerLen = 200

// Config configures an Inbox.
type Config struct {
	// Consumer names the consumer whose processed events this inbox records
	// (the consumer_name column), e.g. "order-projection". Required. Two
	// inboxes with the same name share their dedup rows; give every
	// independent consumer its own name, and never rename one that is
	// running (the renamed consumer would apply every redelivered event
	// again). At most MaxConsumerLen bytes of valid UTF-8, without control
	// characters or leading/trailing spaces.
	Consumer string

	// Now is the clock that stamps processed_at. Defaults to time.Now.
	Now func() time.Time

	// Logger receives warnings (a failed rollback) and debug messages
	// (skipped duplicates). Defaults to slog.Default().
	Logger *slog.Logger

	// OnResult, if set, is called once per Process, ProcessTx,
	// ProcessBatch, ProcessBatchTx, ProcessBulk and ProcessBulkTx call that
	// returned (not one that panicked), with
	// what it did: for metrics of processed and duplicate events. It runs
	// on the caller's goroutine and must be fast. Defaults to nil.
	OnResult func(ctx context.Context, r Result)

	// Tracer, if set, traces every call with an idem.inbox.batch span
	// (attributes idem.consumer, idem.events, idem.applied,
	// idem.duplicates) that continues or links the producers' trace
	// context found in the events' Headers (read with
	// observe.DefaultPropagator), and every event ProcessBatch hands to its
	// handler with an idem.inbox.handle span, a child of the event's
	// producer span. See package observe. Nil (the default) traces nothing.
	Tracer observe.Tracer
}

// Result is what one call did, as reported to Config.OnResult.
type Result struct {
	// Consumer is Config.Consumer.
	Consumer string
	// Events is how many events the call was given.
	Events int
	// Applied events had their handler run and, for Process and
	// ProcessBatch, their effect committed. For the Tx variants the caller
	// still decides whether the transaction commits.
	Applied int
	// Duplicates were skipped: already processed, or repeated in the batch.
	Duplicates int
	// Err is the error the call returned; Applied and Duplicates are then 0.
	Err error
	// Duration is the time the call took.
	Duration time.Duration
}

func (c Config) withDefaults() Config {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	if err := validateConsumer(c.Consumer); err != nil {
		return fmt.Errorf("inbox: invalid config: %w", err)
	}
	return nil
}

func validateConsumer(name string) error {
	switch {
	case name == "":
		return errors.New("consumer: the name is required")
	case len(name) > MaxConsumerLen:
		return fmt.Errorf("consumer: the name is %d bytes long; at most %d", len(name), MaxConsumerLen)
	case !utf8.ValidString(name):
		return fmt.Errorf("consumer %q: not valid UTF-8", name)
	case strings.TrimSpace(name) != name:
		return fmt.Errorf("consumer %q: leading or trailing spaces", name)
	case strings.ContainsFunc(name, unicode.IsControl):
		return fmt.Errorf("consumer %q: contains a control character", name)
	}
	return nil
}
