package inbox_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/google/uuid"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/inbox"
)

// memDriver is a driver that keeps nothing: every id it is given is new.
// It measures the inbox's own work per batch, without a database.
type memDriver struct{ driver.InboxExecutor }

type memTx struct{}

func (memDriver) Name() string                          { return "mem" }
func (memDriver) Caps() driver.Caps                     { return driver.Caps{} }
func (memDriver) Begin(context.Context) (memTx, error)  { return memTx{}, nil }
func (memDriver) Commit(context.Context, memTx) error   { return nil }
func (memDriver) Rollback(context.Context, memTx) error { return nil }
func (d memDriver) Inbox() driver.InboxExecutor         { return d }
func (d memDriver) InboxTx(memTx) driver.InboxExecutor  { return d }
func (memDriver) InboxInsert(_ context.Context, p *driver.InboxInsertParams) ([]uuid.UUID, error) {
	return driver.SortedUniqueIDs(p.IDs), nil
}

// BenchmarkProcessBatch is ProcessBatch's own cost for a poll of 500 new
// events (idemkafka's MaxPollRecords) with a handler that does nothing.
func BenchmarkProcessBatch(b *testing.B) {
	ib, err := inbox.New[memTx](memDriver{}, &inbox.Config{Consumer: "bench", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	evs := make([]inbox.Event, 500)
	for i := range evs {
		id, err := event.NewID()
		if err != nil {
			b.Fatal(err)
		}
		evs[i] = inbox.Event{ID: id}
	}
	ctx := context.Background()
	fn := func(context.Context, memTx, inbox.Event) error { return nil }
	b.ReportAllocs()
	for b.Loop() {
		res, err := ib.ProcessBatch(ctx, evs, fn)
		if err != nil || res.Applied != len(evs) {
			b.Fatal(res, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(evs)), "ns/event")
}
