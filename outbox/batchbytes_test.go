package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/outbox"
)

// claimSizes wraps a driver and records the payload bytes of every claim
// it returns: what a relay holds in memory at once for one batch.
type claimSizes[TTx any] struct {
	driver.OutboxDriver[TTx]
	mu     sync.Mutex
	claims [][]int // payload sizes, one slice per claim that returned rows
}

func (d *claimSizes[TTx]) Outbox() driver.OutboxExecutor {
	return claimSizesExec[TTx]{d.OutboxDriver.Outbox(), d}
}

func (d *claimSizes[TTx]) OutboxTx(tx TTx) driver.OutboxExecutor {
	return claimSizesExec[TTx]{d.OutboxDriver.OutboxTx(tx), d}
}

type claimSizesExec[TTx any] struct {
	driver.OutboxExecutor
	d *claimSizes[TTx]
}

func (e claimSizesExec[TTx]) OutboxClaimBatch(ctx context.Context, p *driver.OutboxClaimBatchParams) ([]driver.OutboxRow, error) {
	rows, err := e.OutboxExecutor.OutboxClaimBatch(ctx, p)
	if len(rows) > 0 {
		sizes := make([]int, len(rows))
		for i, r := range rows {
			sizes[i] = len(r.Payload)
		}
		e.d.mu.Lock()
		e.d.claims = append(e.d.claims, sizes)
		e.d.mu.Unlock()
	}
	return rows, err
}

// bigEvent returns an event of key whose JSON payload is size bytes.
func bigEvent(t *testing.T, key string, size int) event.Envelope {
	t.Helper()
	p, err := json.Marshal(strings.Repeat("x", size-2))
	if err != nil {
		t.Fatal(err)
	}
	e, err := event.New("Test.Big.v1", key, json.RawMessage(p))
	if err != nil {
		t.Fatal(err)
	}
	if len(e.Payload) != size {
		t.Fatalf("payload of %d bytes; want %d", len(e.Payload), size)
	}
	return e
}

// A backlog of large events is drained in batches whose payloads stay
// within the byte bound (RelayConfig.BatchBytes, 16 MiB by default), however
// many events BatchSize allows: a relay restarted after an outage must not
// read hundreds of MiB into memory per batch (an OOM kill, then the same
// backlog again on restart). Nothing is lost and each key keeps its order.
func TestRelayBoundsTheBytesOfABatch(t *testing.T) {
	t.Parallel()
	onEveryBackend(t, checkBatchBytes[*sql.Tx], checkBatchBytes[pgx.Tx])
}

func checkBatchBytes[TTx any](t *testing.T, drv driver.OutboxDriver[TTx]) {
	const (
		mib      = 1 << 20
		defBound = 16 * mib
	)
	keys := []string{"a", "b", "c"}
	var (
		events []event.Envelope
		want   = map[string][]string{}
	)
	for i := range 18 { // 18 MiB: more than the default bound, fewer than BatchSize events
		e := bigEvent(t, keys[i%len(keys)], mib)
		events = append(events, e)
		want[e.Key] = append(want[e.Key], e.ID.String())
	}
	for i := 0; i < len(events); i += 3 {
		enqueueTx(t, drv, events[i:i+3]...)
	}
	spy := &claimSizes[TTx]{OutboxDriver: drv}
	var (
		mu  sync.Mutex
		got = map[string][]string{}
	)
	pub := outbox.PublisherFunc(func(_ context.Context, evs []event.Envelope) error {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range evs {
			got[e.Key] = append(got[e.Key], e.ID.String())
		}
		return nil
	})
	relay := newLateRelay(t, driver.OutboxDriver[TTx](spy), pub, nil)
	for round := 0; !allPublished(t, drv); round++ {
		if round > len(events) {
			t.Fatalf("not drained in %d rounds", round)
		}
		if _, err := relay.RunOnce(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range spy.claims {
		total := 0
		for _, s := range c {
			total += s
		}
		if total > defBound && len(c) > 1 {
			t.Errorf("claim %d held %d events of %.1f MiB of payloads; want at most %d MiB (RelayConfig.BatchBytes' default)",
				i+1, len(c), float64(total)/mib, defBound/mib)
		}
	}
	for _, k := range keys {
		if fmt.Sprint(got[k]) != fmt.Sprint(want[k]) {
			t.Errorf("key %s: published %v; want %v", k, got[k], want[k])
		}
	}
}
