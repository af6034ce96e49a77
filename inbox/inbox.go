package inbox

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/txbegin"
	"github.com/idemkit/idem/internal/txnil"
)

// Inbox deduplicates the events of one consumer. TTx is the transaction type
// of the driver (pgx.Tx, *sql.Tx); the handlers receive it. Build one per
// consumer with New; it is safe for concurrent use.
type Inbox[TTx any] struct {
	drv driver.InboxDriver[TTx]
	cfg Config
}

// New returns an inbox storing its processed_event rows through drv, whose
// migrations must have run. cfg is required (Consumer has no default).
func New[TTx any](drv driver.InboxDriver[TTx], cfg *Config) (*Inbox[TTx], error) {
	if txnil.Is(drv) { // nil, or a nil *Driver from an Open whose error was ignored
		return nil, errors.New("inbox: nil driver")
	}
	if cfg == nil {
		return nil, errors.New("inbox: nil config: Config.Consumer is required")
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &Inbox[TTx]{drv: drv, cfg: c}, nil
}

// Consumer returns the consumer name the inbox records events under.
func (ib *Inbox[TTx]) Consumer() string { return ib.cfg.Consumer }

// commitGrace is how long a COMMIT may still run after the caller's
// context ended (the effects in flight of a shutdown commit); then it is
// cancelled and its outcome is unknown.
const commitGrace = 5 * time.Second

// commitContext returns the context of a COMMIT: not cancelled with ctx,
// but commitGrace after ctx ended, or after the stop context ctx carries
// ended, whichever comes first (a consumer runs its work on a detached
// context marked with txbegin.WithStop, so that its own end is the
// shutdown; a context derived from it may still end before). stop releases
// it once the COMMIT returned.
func commitContext(ctx context.Context) (cctx context.Context, stop func()) {
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var (
		mu    sync.Mutex
		timer *time.Timer
		done  bool
	)
	ended := func() {
		mu.Lock()
		defer mu.Unlock()
		if !done && timer == nil { // the first of ctx and its stop to end
			timer = time.AfterFunc(commitGrace, cancel)
		}
	}
	unregister := context.AfterFunc(ctx, ended)
	unregisterStop := func() bool { return false }
	if s, ok := txbegin.Stop(ctx); ok {
		unregisterStop = context.AfterFunc(s, ended)
	}
	return cctx, func() {
		unregister()
		unregisterStop()
		mu.Lock()
		done = true
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancel()
	}
}

// rollback ends tx, even when ctx is already cancelled.
func (ib *Inbox[TTx]) rollback(ctx context.Context, tx TTx) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := ib.drv.Rollback(ctx, tx); err != nil {
		ib.cfg.Logger.Warn("inbox: rollback failed", "consumer", ib.cfg.Consumer, "err", err)
	}
}

// report calls Config.OnResult.
func (ib *Inbox[TTx]) report(ctx context.Context, n int, res BatchResult, err error, started time.Time) {
	if ib.cfg.OnResult == nil {
		return
	}
	ib.cfg.OnResult(ctx, Result{
		Consumer:   ib.cfg.Consumer,
		Events:     n,
		Applied:    res.Applied,
		Duplicates: res.Duplicates,
		Err:        err,
		Duration:   time.Since(started),
	})
}
