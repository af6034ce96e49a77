package checkinsert

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func pgxTx(ctx context.Context, tx pgx.Tx, id string) error {
	var n int
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM processed_event WHERE event_id = $1", id).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil // a duplicate
	}
	_, err := tx.Exec(ctx, "INSERT INTO processed_event (event_id) VALUES ($1)", id) // want "check-then-insert on processed_event races: insert with ON CONFLICT DO NOTHING"
	return err
}

func pool(ctx context.Context, p *pgxpool.Pool, key string) error {
	rows, err := p.Query(ctx, `SELECT 1 FROM public."Idempotency_Keys" WHERE key = $1`, key)
	if err != nil {
		return err
	}
	rows.Close()
	_, err = p.Exec(ctx, `INSERT INTO public."Idempotency_Keys" (key) VALUES ($1)`, key) // want "check-then-insert on idempotency_keys races"
	return err
}

const (
	seenSQL   = "SELECT EXISTS (SELECT 1 FROM orders_inbox WHERE id = ?)"
	recordSQL = "INSERT INTO orders_inbox (id) VALUES (?)"
)

func databaseSQL(ctx context.Context, db *sql.DB, id string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var seen bool
	if err := tx.QueryRowContext(ctx, seenSQL, id).Scan(&seen); err != nil || seen {
		return err
	}
	if _, err := tx.ExecContext(ctx, recordSQL, id); err != nil { // want "check-then-insert on orders_inbox"
		return err
	}
	return tx.Commit()
}

func inClosure(ctx context.Context, db *sql.DB, id string) func() error {
	return func() error {
		var x int
		err := db.QueryRowContext(ctx, "-- seen?\nSELECT 1 FROM dedup_keys k JOIN dedup_keys j ON true WHERE k.id = $1", id).Scan(&x)
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		_, err = db.ExecContext(ctx, "INSERT OR REPLACE INTO dedup_keys (id) VALUES ($1)", id) // want "check-then-insert on dedup_keys"
		return err
	}
}

// The SQL in local variables.
func variables(ctx context.Context, tx pgx.Tx, id string) error {
	check := "SELECT count(*) FROM processed_event WHERE event_id = $1"
	var insert = "INSERT INTO processed_event (event_id) VALUES ($1)"
	var n int
	if err := tx.QueryRow(ctx, check, id).Scan(&n); err != nil || n > 0 {
		return err
	}
	_, err := tx.Exec(ctx, insert, id) // want "check-then-insert on processed_event races"
	return err
}

// Not reported.

// The SELECT may be the caller's query: a parameter assigned a constant
// is not a constant.
func paramQuery(ctx context.Context, tx pgx.Tx, id, check string) error {
	if check == "" {
		check = "SELECT count(*) FROM processed_event WHERE event_id = $1"
	}
	var n int
	tx.QueryRow(ctx, check, id).Scan(&n)
	_, err := tx.Exec(ctx, "INSERT INTO processed_event (event_id) VALUES ($1)", id)
	return err
}

func onConflict(ctx context.Context, tx pgx.Tx, id string) error {
	var n int
	tx.QueryRow(ctx, "SELECT count(*) FROM processed_event WHERE event_id = $1", id).Scan(&n)
	_, err := tx.Exec(ctx, "INSERT INTO processed_event (event_id) VALUES ($1) ON CONFLICT (event_id) DO NOTHING", id)
	return err
}

func insertOrIgnore(ctx context.Context, db *sql.DB, id string) error {
	var n int
	db.QueryRowContext(ctx, "SELECT count(*) FROM inbox WHERE id = ?", id).Scan(&n)
	_, err := db.ExecContext(ctx, "INSERT OR IGNORE INTO inbox (id) VALUES (?)", id)
	return err
}

func otherTable(ctx context.Context, tx pgx.Tx, id string) error {
	var n int
	tx.QueryRow(ctx, "SELECT count(*) FROM processed_event WHERE event_id = $1", id).Scan(&n)
	_, err := tx.Exec(ctx, "INSERT INTO orders (id) VALUES ($1)", id)
	return err
}

func notDedupTable(ctx context.Context, tx pgx.Tx, id string) error {
	var n int
	tx.QueryRow(ctx, "SELECT count(*) FROM orders WHERE id = $1", id).Scan(&n)
	_, err := tx.Exec(ctx, "INSERT INTO orders (id) VALUES ($1)", id)
	return err
}

func selectOnly(ctx context.Context, p *pgxpool.Pool) (int, error) {
	var n int
	err := p.QueryRow(ctx, "SELECT count(*) FROM processed_event").Scan(&n)
	return n, err
}

func insertOnly(ctx context.Context, tx pgx.Tx, id string) error {
	_, err := tx.Exec(ctx, "INSERT INTO processed_event (event_id) VALUES ($1)", id)
	return err
}

func insertFirst(ctx context.Context, tx pgx.Tx, id string) error {
	// The INSERT decides (a duplicate fails on the key); the SELECT after
	// it reads.
	if _, err := tx.Exec(ctx, "INSERT INTO processed_event (event_id) VALUES ($1)", id); err != nil {
		return err
	}
	var n int
	return tx.QueryRow(ctx, "SELECT count(*) FROM processed_event").Scan(&n)
}

func columnNotTable(ctx context.Context, tx pgx.Tx, id string) error {
	var n int
	tx.QueryRow(ctx, "SELECT count(*) FROM events WHERE source = 'FROM inbox'", id).Scan(&n)
	_, err := tx.Exec(ctx, "INSERT INTO inbox (id) VALUES ($1)", id)
	return err
}

// More dedup table names: processed_* (processed_webhooks, processed_payments),
// idempotency* and *webhook_event(s), the names webhook receivers give the
// table of the event IDs they applied.

func webhookEvents(ctx context.Context, db *sql.DB, eventID string) error {
	var exists bool
	if err := db.QueryRowContext(ctx, `SELECT EXISTS(SELECT 1 FROM webhook_events WHERE event_id = $1)`, eventID).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	_, err := db.ExecContext(ctx, `INSERT INTO webhook_events (event_id) VALUES ($1)`, eventID) // want "check-then-insert on webhook_events races"
	return err
}

func stripeWebhookEvent(ctx context.Context, tx pgx.Tx, eventID string) error {
	var n int
	tx.QueryRow(ctx, "SELECT count(*) FROM billing.stripe_webhook_event WHERE id = $1", eventID).Scan(&n)
	_, err := tx.Exec(ctx, "INSERT INTO billing.stripe_webhook_event (id) VALUES ($1)", eventID) // want "check-then-insert on stripe_webhook_event races"
	return err
}

func processedWebhooks(ctx context.Context, tx pgx.Tx, id string) error {
	var n int
	tx.QueryRow(ctx, "SELECT 1 FROM processed_webhooks WHERE id = $1 FOR UPDATE", id).Scan(&n)
	_, err := tx.Exec(ctx, "INSERT INTO processed_webhooks (id) VALUES ($1)", id) // want "check-then-insert on processed_webhooks races"
	return err
}

func idempotencyRequests(ctx context.Context, p *pgxpool.Pool, key string) error {
	var n int
	p.QueryRow(ctx, "SELECT 1 FROM idempotency_requests WHERE key = $1", key).Scan(&n)
	_, err := p.Exec(ctx, "INSERT INTO idempotency_requests (key) VALUES ($1)", key) // want "check-then-insert on idempotency_requests races"
	return err
}

// Not dedup tables: a name that only contains one of the words.

func notDedupNames(ctx context.Context, tx pgx.Tx, id string) error {
	var n int
	tx.QueryRow(ctx, "SELECT count(*) FROM unprocessed_orders WHERE id = $1", id).Scan(&n)
	tx.QueryRow(ctx, "SELECT count(*) FROM webhook_event_types WHERE id = $1", id).Scan(&n)
	tx.QueryRow(ctx, "SELECT count(*) FROM webhooks WHERE id = $1", id).Scan(&n)
	tx.Exec(ctx, "INSERT INTO unprocessed_orders (id) VALUES ($1)", id)
	tx.Exec(ctx, "INSERT INTO webhook_event_types (id) VALUES ($1)", id)
	_, err := tx.Exec(ctx, "INSERT INTO webhooks (id) VALUES ($1)", id)
	return err
}

// The check and the insert in methods of a repository the handler calls.

type repo struct{ pool *pgxpool.Pool }

func (r *repo) isProcessed(ctx context.Context, id string) (bool, error) {
	var seen bool
	err := r.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM processed_events WHERE id = $1)", id).Scan(&seen)
	return seen, err
}

func (r *repo) markProcessed(ctx context.Context, id string) error {
	_, err := r.pool.Exec(ctx, "INSERT INTO processed_events (id) VALUES ($1)", id)
	return err
}

func (r *repo) markProcessedOnce(ctx context.Context, id string) (bool, error) {
	tag, err := r.pool.Exec(ctx, "INSERT INTO processed_events (id) VALUES ($1) ON CONFLICT DO NOTHING", id)
	return tag.RowsAffected() == 1, err
}

func (r *repo) record(ctx context.Context, id string) error {
	return r.markProcessed(ctx, id) // a helper of a helper
}

func handleSplit(ctx context.Context, r *repo, id string) error {
	seen, err := r.isProcessed(ctx, id)
	if err != nil || seen {
		return err
	}
	return r.markProcessed(ctx, id) // want `check-then-insert on processed_events races: .* \(checked in isProcessed, inserted in markProcessed\)`
}

func handleDeeper(ctx context.Context, r *repo, id string) error {
	if seen, _ := r.isProcessed(ctx, id); seen {
		return nil
	}
	return r.record(ctx, id) // want `check-then-insert on processed_events races: .* \(checked in isProcessed, inserted in record\)`
}

func handleMixed(ctx context.Context, p *pgxpool.Pool, r *repo, id string) error {
	if seen, _ := r.isProcessed(ctx, id); seen {
		return nil
	}
	_, err := p.Exec(ctx, "INSERT INTO processed_events (id) VALUES ($1)", id) // want `check-then-insert on processed_events races: .* \(checked in isProcessed\)`
	return err
}

// Not reported: the insert skips a row already there; the insert before
// the read.

func handleOnce(ctx context.Context, r *repo, id string) error {
	if seen, _ := r.isProcessed(ctx, id); seen {
		return nil
	}
	_, err := r.markProcessedOnce(ctx, id)
	return err
}

func insertThenRead(ctx context.Context, r *repo, id string) error {
	if err := r.markProcessed(ctx, id); err != nil {
		return err
	}
	_, err := r.isProcessed(ctx, id)
	return err
}
