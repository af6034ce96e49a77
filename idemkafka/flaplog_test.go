package idemkafka_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testlog"
)

// flappingDriver is a database short of connections (a role's CONNECTION
// LIMIT, SQLSTATE 53300) while flapping is set: every other Begin fails.
type flappingDriver[TTx any] struct {
	driver.Driver[TTx]
	flapping atomic.Bool
	begins   atomic.Int64
}

func (d *flappingDriver[TTx]) Begin(ctx context.Context) (TTx, error) {
	if d.flapping.Load() && d.begins.Add(1)%2 == 0 {
		var zero TTx
		return zero, &pgconn.PgError{Severity: "FATAL", Code: "53300", Message: `too many connections for role "idemd"`}
	}
	return d.Driver.Begin(ctx)
}

// A consumer whose transactions alternate failing and going through (a
// database short of connections) logs one line when the failures start
// (a summary every 30 s while they go on) and one line once no batch
// failed for the quiet period (10 s; 3 s here: on a loaded machine 300
// ms passed between two records' batches). It logged "batch
// failed; retrying" for every batch that failed once.
func TestFlappingDatabaseLoggedOnce(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic, group := consumedTopic(t, kc, 1)
	drv := &flappingDriver[*sqlTx]{Driver: b.open(t)}
	drv.flapping.Store(true)
	in, err := inbox.New[*sqlTx](drv, &inbox.Config{Consumer: "billing", Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	var logs testlog.Buffer
	cfg := consumerConfig(kc, b, "billing", group, nil, topic)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	var applied atomic.Int64
	cfg.OnBatch = func(_ context.Context, s idemkafka.BatchStats) { applied.Add(int64(s.Applied)) }
	inst := startWith(t, drv, in, cfg, func(c *idemkafka.Consumer[*sqlTx]) {
		idemkafka.SetDBLogTimes(c, time.Hour, 3*time.Second)
	})
	var evs []event.Envelope
	produce := func(n int) {
		for range n {
			e := newEvents(t, 1, 1)
			evs = append(evs, e...)
			kc.Produce(t, topic, recordsOf(topic, e...)...)
			want := int64(len(evs))
			waitFor(t, 30*time.Second, "the record applied", func() bool { return applied.Load() >= want })
		}
	}
	produce(40) // a transaction per record, every other Begin failing
	drv.flapping.Store(false)
	time.Sleep(3500 * time.Millisecond) // the quiet period, without a failure
	produce(1)
	mustStop(t, inst)
	mustOnce(t, b, "billing", evs)

	count := func(prefix string) int { return strings.Count(logs.String(), "msg=\""+prefix) }
	failed := count("idemkafka: batch failed; retrying") + count("idemkafka: giving up on the batch")
	still, ended := count("idemkafka: batches still failing"), count("idemkafka: batches succeed again")
	t.Logf("%d Begin calls: %d 'batch failed'/'giving up', %d 'still failing', %d 'succeed again' lines", drv.begins.Load(), failed, still, ended)
	if failed != 1 || still != 0 || ended != 1 || !strings.Contains(logs.String(), "53300") {
		t.Errorf("%d 'batch failed'/'giving up', %d 'still failing', %d 'succeed again' lines; want 1, 0 and 1; logs:\n%s", failed, still, ended, logs.String())
	}
}
