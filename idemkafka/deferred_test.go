package idemkafka_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testdb"
)

// A record whose effect breaks a deferred constraint (a ledger's foreign
// key checked at COMMIT) makes the COMMIT fail, not a statement of the
// handler: the batch rolls back and nothing says which record was at fault.
// That is the batch's content, not a database outage: its records are
// applied one at a time, the one at fault fails alone and is dead-lettered
// after Retry.Attempts, the others are applied. It was retried as a
// database outage for ever before: the partition never moved again.
func TestDeferredConstraintAtCommitDeadLettered(t *testing.T) {
	t.Parallel()
	testdb.RequirePostgres(t)
	b := setupPostgres(t)
	drv := b.open(t)
	ctx := t.Context()
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE account (id int PRIMARY KEY)`,
		`INSERT INTO account VALUES (1)`,
		`CREATE TABLE entry (event_id uuid PRIMARY KEY, account int NOT NULL REFERENCES account (id) DEFERRABLE INITIALLY DEFERRED)`,
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := drv.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}

	kc := kafkatest.New(t)
	topic := kc.Topic(t, "ledger", 1)
	group := kafkatest.Name("g")
	evs := newEvents(t, 5, 1)
	bad := evs[2].ID

	cfg := consumerConfig(kc, b, "ledger", group, nil, topic)
	effect := cfg.Handler
	cfg.Handler = func(ctx context.Context, tx pgx.Tx, e event.Envelope) error {
		account := 1
		if e.ID == bad {
			account = 999 // no such account: refused at COMMIT
		}
		if _, err := tx.Exec(ctx, `INSERT INTO entry VALUES ($1, $2)`, e.ID, account); err != nil {
			return err
		}
		return effect(ctx, tx, e)
	}
	runDeferred(t, kc, b, cfg, topic, group, evs, bad)
}

// The same on SQLite (a foreign key DEFERRABLE INITIALLY DEFERRED, with the
// driver's PRAGMA foreign_keys on).
func TestDeferredConstraintAtCommitDeadLetteredSQLite(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	drv := b.open(t).(*sqlitedriver.Driver)
	for _, q := range []string{
		`CREATE TABLE account (id INTEGER PRIMARY KEY)`,
		`INSERT INTO account VALUES (1)`,
		`CREATE TABLE entry (event_id TEXT PRIMARY KEY, account INTEGER NOT NULL REFERENCES account (id) DEFERRABLE INITIALLY DEFERRED)`,
	} {
		if _, err := drv.DB().Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "ledger", 1)
	group := kafkatest.Name("g")
	evs := newEvents(t, 5, 1)
	bad := evs[2].ID
	cfg := consumerConfig(kc, b, "ledger", group, nil, topic)
	effect := cfg.Handler
	cfg.Handler = func(ctx context.Context, tx *sql.Tx, e event.Envelope) error {
		account := 1
		if e.ID == bad {
			account = 999
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO entry VALUES (?, ?)`, e.ID.String(), account); err != nil {
			return err
		}
		return effect(ctx, tx, e)
	}
	runDeferred(t, kc, b, cfg, topic, group, evs, bad)
}

func runDeferred[TTx any](t *testing.T, kc *kafkatest.Cluster, b *backend[TTx], cfg idemkafka.ConsumerConfig[TTx], topic, group string, evs []event.Envelope, bad uuid.UUID) {
	t.Helper()
	dlq := topic + idemkafka.DeadLetterSuffix
	kc.CreateTopic(t, dlq, 1)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)
	inst := start(t, b, "ledger", cfg)
	waitFor(t, 20*time.Second, "the partition committed to its end", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)

	var good []event.Envelope
	for _, e := range evs {
		if e.ID != bad {
			good = append(good, e)
		}
	}
	mustOnce(t, b, "ledger", good)
	dead := kc.Records(t, dlq)
	if len(dead) != 1 {
		t.Fatalf("%d dead letters; want 1 (the record refused at COMMIT)", len(dead))
	}
	if id := header(dead[0], event.HeaderEventID); id != bad.String() {
		t.Fatalf("dead letter of event %s; want %s", id, bad)
	}
}
