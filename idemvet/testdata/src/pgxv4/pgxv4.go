// Package pgxv4 checks that the database rules know pgx v4 handles as they
// know v5's: a kafka-go consumer writing through a v4 connection, a
// check-then-insert through a v4 pool, float money passed to a v4 Exec.
package pgxv4

import (
	"context"

	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
	"github.com/segmentio/kafka-go"
)

func consume(ctx context.Context, r *kafka.Reader, conn *pgx.Conn) error {
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return err
		}
		if _, err := conn.Exec(ctx, "INSERT INTO documents (id, body) VALUES ($1, $2)", m.Key, m.Value); err != nil { // want "kafka consumer writes to the database without deduplication"
			return err
		}
		r.CommitMessages(ctx, m)
	}
}

func consumeTx(ctx context.Context, r *kafka.Reader, conn *pgx.Conn) error {
	m, err := r.FetchMessage(ctx)
	if err != nil {
		return err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	tx.Exec(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = $1", m.Key) // want "without deduplication"
	return tx.Commit(ctx)
}

func checkThenInsert(ctx context.Context, p *pgxpool.Pool, id string) error {
	var n int
	if err := p.QueryRow(ctx, "SELECT count(*) FROM processed_events WHERE id = $1", id).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	_, err := p.Exec(ctx, "INSERT INTO processed_events (id) VALUES ($1)", id) // want "check-then-insert on processed_events races"
	return err
}

func floatPrice(ctx context.Context, p *pgxpool.Pool, price float64) {
	p.Exec(ctx, "UPDATE items SET price = $1", price) // want "money held as float"
}

// Not reported.

func dedup(ctx context.Context, r *kafka.Reader, p *pgxpool.Pool) error {
	m, err := r.FetchMessage(ctx)
	if err != nil {
		return err
	}
	_, err = p.Exec(ctx, "INSERT INTO documents (id, body) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING", m.Key, m.Value)
	return err
}
