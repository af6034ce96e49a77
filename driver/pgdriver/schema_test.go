package pgdriver_test

import (
	"context"
	"hash/fnv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// Services in two schemas of one database, each configured without a
// schema (tables found through search_path), used the same lane locks and
// the same NOTIFY channel: one service's relay held the other's lanes. Now
// the lock class and the channel are named after the resolved schema, the
// same as for a driver that names it.
func TestOutboxSchemaFromSearchPath(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	poolA, schemaA := testdb.Schema(t, 6)
	poolB, _ := testdb.Schema(t, 6)
	drvA, drvB := newMigrated(t, poolA, nil), newMigrated(t, poolB, nil)
	enqueueKey(t, drvA, "k")
	enqueueKey(t, drvB, "k") // the same key: the same lane in both schemas

	// A's relay claims its lane and blocks in Publish.
	entered, release := make(chan struct{}), make(chan struct{})
	relayA := newRelay(t, drvA, outbox.PublisherFunc(func(context.Context, []event.Envelope) error {
		close(entered)
		<-release
		return nil
	}), &outbox.RelayConfig{NoListen: true})
	doneA := make(chan struct{})
	var errA error
	go func() {
		defer close(doneA)
		_, errA = relayA.RunOnce(ctx)
	}()
	defer func() { close(release); <-doneA }()
	select {
	case <-entered:
	case <-doneA:
		t.Fatalf("relay A's round ended without publishing: %v", errA)
	case <-time.After(30 * time.Second):
		t.Fatal("relay A did not publish within 30s")
	}

	// B's relay publishes B's event meanwhile.
	published := 0
	relayB := newRelay(t, drvB, outbox.PublisherFunc(func(_ context.Context, batch []event.Envelope) error {
		published += len(batch)
		return nil
	}), &outbox.RelayConfig{NoListen: true})
	if _, err := relayB.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if published != 1 {
		t.Errorf("relay B published %d events while relay A (another schema) held its lane; want 1", published)
	}

	// A replica of A naming the schema shares the lane locks and the
	// channel of one finding it through search_path.
	named := newMigrated(t, poolA, &pgdriver.Config{Schema: schemaA})
	enqueueKey(t, drvA, "k")
	published = 0
	relayNamed := newRelay(t, named, outbox.PublisherFunc(func(_ context.Context, batch []event.Envelope) error {
		published += len(batch)
		return nil
	}), &outbox.RelayConfig{NoListen: true})
	if _, err := relayNamed.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if published != 0 {
		t.Errorf("a replica naming schema %s published %d events of the lane relay A holds; want 0", schemaA, published)
	}
	if a, n := drvA.OutboxChannel(), named.OutboxChannel(); a != n {
		t.Errorf("OutboxChannel without Schema = %q, with Schema = %q; want the same", a, n)
	}
}

// A relay of a version that named the lane locks after the prefix only
// (without a schema) holds a lane exclusively: a relay of this version, on
// the same tables, does not claim it meanwhile (a rolling upgrade). It runs
// in a database of its own: the lanes' legacy lock class is the same for
// every driver without a schema, so holding its locks in the shared test
// database would stop the other tests' relays (advisory locks are per
// database).
func TestOutboxLegacyLaneLock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testdb.Database(t, 4)
	drv := newMigrated(t, pool, nil)
	enqueueKey(t, drv, "k")
	h := fnv.New32a()
	_, _ = h.Write([]byte("outbox"))
	legacy := int32(h.Sum32()) //nolint:gosec // a lock ID
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1::int, l) FROM generate_series(0, 63) l`, legacy); err != nil {
		t.Fatal(err)
	}
	published := 0
	relay := newRelay(t, drv, outbox.PublisherFunc(func(_ context.Context, batch []event.Envelope) error {
		published += len(batch)
		return nil
	}), &outbox.RelayConfig{NoListen: true})
	if _, err := relay.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if published != 0 {
		t.Errorf("published %d events of lanes an older relay holds; want 0", published)
	}
	_ = tx.Rollback(ctx)
	if _, err := relay.RunOnce(ctx); err != nil || published != 1 {
		t.Errorf("after the older relay's end: published %d, %v; want 1", published, err)
	}
}

func newMigrated(t *testing.T, pool *pgxpool.Pool, cfg *pgdriver.Config) *pgdriver.Driver {
	t.Helper()
	drv, err := pgdriver.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return drv
}

func enqueueKey(t *testing.T, drv *pgdriver.Driver, key string) {
	t.Helper()
	e, err := event.New("Test.Happened.v1", key, map[string]string{"k": key})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := drv.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.EnqueueTx(t.Context(), drv, tx, e); err != nil {
		t.Fatal(err)
	}
	if err := drv.Commit(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
}

// The schema is the outbox table's, not current_schema(): with a
// search_path whose first schema exists but holds no idem tables ("$user",
// public for a role owning a schema of its name), a replica still shares
// the channel and lane locks of one naming the tables' schema.
func TestOutboxSchemaOfTheTable(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, schema := testdb.Schema(t, 4)
	_, empty := testdb.Schema(t, 1) // exists, holds no idem tables
	named := newMigrated(t, pool, &pgdriver.Config{Schema: schema})
	cfg, err := pgxpool.ParseConfig(testdb.DSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = empty + "," + schema
	mixed, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer mixed.Close()
	var cur string
	if err := mixed.QueryRow(ctx, `SELECT current_schema()`).Scan(&cur); err != nil || cur != empty {
		t.Fatalf("current_schema() = %q, %v; want %s (the test's premise)", cur, err, empty)
	}
	drv, err := pgdriver.New(mixed, nil)
	if err != nil {
		t.Fatal(err)
	}
	enqueueKey(t, drv, "k") // resolves the outbox's names
	if got, want := drv.OutboxChannel(), named.OutboxChannel(); got != want {
		t.Errorf("OutboxChannel through search_path %s,%s = %q; want %q (the tables' schema)", empty, schema, got, want)
	}
}
