package consumer

import (
	"context"
	"database/sql"
	"encoding/json"

	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/inbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
)

func naive(ctx context.Context, cl *kgo.Client, pool *pgxpool.Pool) {
	for {
		fs := cl.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) {
			pool.Exec(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = $1", r.Key) // want "kafka consumer writes to the database without deduplication"
		})
	}
}

func naiveSQL(ctx context.Context, cl *kgo.Client, db *sql.DB) {
	for ctx.Err() == nil {
		for _, r := range cl.PollRecords(ctx, 100).Records() {
			tx, _ := db.BeginTx(ctx, nil)
			tx.ExecContext(ctx, "INSERT INTO payments (key) VALUES ($1)", r.Key) // want "without deduplication"
			tx.Commit()
		}
	}
}

func upsertIsNotDedup(ctx context.Context, cl *kgo.Client, conn *pgx.Conn) {
	fs := cl.PollFetches(ctx)
	for _, r := range fs.Records() {
		conn.Exec(ctx, "INSERT INTO totals VALUES ($1, 1) ON CONFLICT (k) DO UPDATE SET n = totals.n + 1", r.Key) // want "without deduplication"
	}
}

const credit = "UPDATE accounts SET balance = balance + 1 WHERE id = $1"

func namedConstWrite(ctx context.Context, cl *kgo.Client, pool *pgxpool.Pool) {
	for _, r := range cl.PollFetches(ctx).Records() {
		pool.Exec(ctx, credit, r.Key) // want "without deduplication"
	}
}

// Not reported.

func withInbox(ctx context.Context, cl *kgo.Client, in *inbox.Inbox[pgx.Tx]) {
	for {
		for _, r := range cl.PollFetches(ctx).Records() {
			in.Process(ctx, [16]byte{}, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = $1", r.Key)
				return err
			})
		}
	}
}

func withIdemkafka(ctx context.Context, cl *kgo.Client, pool *pgxpool.Pool) {
	for _, r := range cl.PollFetches(ctx).Records() {
		id, _ := idemkafka.EventID(r)
		pool.Exec(ctx, "SELECT apply($1)", id)
	}
}

func ownDedup(ctx context.Context, cl *kgo.Client, pool *pgxpool.Pool) {
	for _, r := range cl.PollFetches(ctx).Records() {
		pool.Exec(ctx, "INSERT INTO seen (id) VALUES ($1) ON CONFLICT DO NOTHING", r.Key)
	}
}

func noPoll(ctx context.Context, pool *pgxpool.Pool) {
	pool.Exec(ctx, "DELETE FROM sessions")
}

func pollOnly(ctx context.Context, cl *kgo.Client) int {
	return len(cl.PollFetches(ctx).Records())
}

func harness(ctx context.Context, cl *kgo.Client, pool *pgxpool.Pool, table string) int {
	pool.Exec(ctx, "TRUNCATE "+table)
	pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS seen (id uuid)")
	return len(cl.PollFetches(ctx).Records())
}

// The dedup SQL in a named constant, of this package or another.
const insertSeen = "INSERT INTO seen (id) VALUES ($1) ON CONFLICT DO NOTHING"

func constDedup(ctx context.Context, cl *kgo.Client, pool *pgxpool.Pool) {
	for _, r := range cl.PollFetches(ctx).Records() {
		pool.Exec(ctx, insertSeen, r.Key)
	}
}

const (
	insertSeenHead = "INSERT INTO seen (id) VALUES ($1) "
	onConflict     = "ON CONFLICT (id) DO NOTHING"
)

func constConcatDedup(ctx context.Context, cl *kgo.Client, db *sql.DB) {
	for _, r := range cl.PollFetches(ctx).Records() {
		db.ExecContext(ctx, insertSeenHead+onConflict, r.Key)
	}
}

// segmentio/kafka-go: a reader's FetchMessage and ReadMessage poll as
// PollFetches does.

func kafkaGoFetch(ctx context.Context, r *kafka.Reader, pool *pgxpool.Pool) error {
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return err
		}
		if _, err := pool.Exec(ctx, "UPDATE accounts SET balance = balance + $2 WHERE id = $1", m.Key, m.Value); err != nil { // want "kafka consumer writes to the database without deduplication"
			return err
		}
		if err := r.CommitMessages(ctx, m); err != nil {
			return err
		}
	}
}

func kafkaGoRead(ctx context.Context, r *kafka.Reader, db *sql.DB) {
	for {
		m, err := r.ReadMessage(ctx) // want "kafka-go ReadMessage commits the offset before the database commit"
		if err != nil {
			return
		}
		db.ExecContext(ctx, "INSERT INTO orders (id, body) VALUES ($1, $2)", m.Key, m.Value) // want "without deduplication"
	}
}

func kafkaGoDedup(ctx context.Context, r *kafka.Reader, pool *pgxpool.Pool) error {
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return err
		}
		pool.Exec(ctx, "INSERT INTO orders (id, body) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING", m.Key, m.Value)
		r.CommitMessages(ctx, m)
	}
}

func kafkaGoInbox(ctx context.Context, r *kafka.Reader, in *inbox.Inbox[pgx.Tx]) error {
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return err
		}
		in.Process(ctx, [16]byte{}, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = $1", m.Key)
			return err
		})
		r.CommitMessages(ctx, m)
	}
}

// A poll loop that hands each record to a function or method of the
// package: the writes there are the consumer's.

type handler struct{ pool *pgxpool.Pool }

func (h *handler) handle(ctx context.Context, r *kgo.Record) error {
	return h.apply(ctx, r)
}

func (h *handler) apply(ctx context.Context, r *kgo.Record) error {
	_, err := h.pool.Exec(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = $1", r.Key) // want "kafka consumer writes to the database without deduplication"
	return err
}

func (h *handler) run(ctx context.Context, cl *kgo.Client) {
	for {
		fs := cl.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) {
			_ = h.handle(ctx, r)
		})
	}
}

type batchHandler struct{ db *sql.DB }

func (h *batchHandler) handleBatch(ctx context.Context, rs []*kgo.Record) {
	for _, r := range rs {
		h.db.ExecContext(ctx, "INSERT INTO payments (key) VALUES ($1)", r.Key) // want "without deduplication"
	}
}

func (h *batchHandler) run(ctx context.Context, cl *kgo.Client) {
	for {
		h.handleBatch(ctx, cl.PollRecords(ctx, 100).Records())
	}
}

func applyMessage(ctx context.Context, pool *pgxpool.Pool, m kafka.Message) {
	pool.Exec(ctx, "INSERT INTO orders (id, body) VALUES ($1, $2)", m.Key, m.Value) // want "without deduplication"
}

func kafkaGoHandOff(ctx context.Context, r *kafka.Reader, pool *pgxpool.Pool) error {
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return err
		}
		applyMessage(ctx, pool, m)
		r.CommitMessages(ctx, m)
	}
}

type methodValue struct{ pool *pgxpool.Pool }

func (h *methodValue) one(r *kgo.Record) {
	h.pool.Exec(context.Background(), "UPDATE stock SET n = n - 1 WHERE sku = $1", r.Key) // want "without deduplication"
}

func (h *methodValue) run(ctx context.Context, cl *kgo.Client) {
	cl.PollFetches(ctx).EachRecord(h.one)
}

// Not reported: the handler deduplicates, itself or in a helper it calls
// (even without the record), or through a function named for it in
// another package.

type dedupHandler struct{ pool *pgxpool.Pool }

func (h *dedupHandler) handle(ctx context.Context, r *kgo.Record) {
	tx, _ := h.pool.Begin(ctx)
	if !h.markSeen(ctx, tx, r.Key) {
		return
	}
	tx.Exec(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = $1", r.Key)
	tx.Commit(ctx)
}

func (h *dedupHandler) markSeen(ctx context.Context, tx pgx.Tx, id []byte) bool {
	tag, _ := tx.Exec(ctx, "INSERT INTO seen (id) VALUES ($1) ON CONFLICT DO NOTHING", id)
	return tag.RowsAffected() == 1
}

func (h *dedupHandler) run(ctx context.Context, cl *kgo.Client) {
	for {
		for _, r := range cl.PollFetches(ctx).Records() {
			h.handle(ctx, r)
		}
	}
}

type repo interface {
	MarkProcessed(ctx context.Context, tx pgx.Tx, id []byte) (bool, error)
}

type repoHandler struct {
	pool *pgxpool.Pool
	repo repo
}

func (h *repoHandler) handle(ctx context.Context, r *kgo.Record) {
	tx, _ := h.pool.Begin(ctx)
	if ok, _ := h.repo.MarkProcessed(ctx, tx, r.Key); !ok {
		return
	}
	tx.Exec(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = $1", r.Key)
	tx.Commit(ctx)
}

func (h *repoHandler) run(ctx context.Context, cl *kgo.Client) {
	for _, r := range cl.PollFetches(ctx).Records() {
		h.handle(ctx, r)
	}
}

type inboxHandler struct{ in *inbox.Inbox[pgx.Tx] }

func (h *inboxHandler) handle(ctx context.Context, r *kgo.Record) {
	h.in.Process(ctx, [16]byte{}, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = $1", r.Key)
		return err
	})
}

func (h *inboxHandler) run(ctx context.Context, cl *kgo.Client) {
	cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { h.handle(ctx, r) })
}

// A function the records do not reach is not the consumer's.

func audit(ctx context.Context, pool *pgxpool.Pool, n int) {
	pool.Exec(ctx, "INSERT INTO audit (n) VALUES ($1)", n)
}

func countOnly(ctx context.Context, cl *kgo.Client, pool *pgxpool.Pool) {
	audit(ctx, pool, len(cl.PollFetches(ctx).Records()))
}

// The commonest shape: the record decoded into a type of the service,
// then handed to a repository method of the package. What is derived from
// a record (decoded into a variable, a field of it) reaches the functions
// it is given to, and what they pass on.

type order struct {
	ID     string
	Amount int64
}

type store struct{ pool *pgxpool.Pool }

func (s *store) saveOrder(ctx context.Context, o order) error {
	return s.insert(ctx, o.ID, o.Amount)
}

func (s *store) insert(ctx context.Context, id string, amount int64) error {
	_, err := s.pool.Exec(ctx, "INSERT INTO orders (id, amount) VALUES ($1, $2)", id, amount) // want "without deduplication"
	return err
}

func decode(b []byte, o *order) error { return nil }

type worker struct {
	cl    *kgo.Client
	store *store
}

func (w *worker) run(ctx context.Context) error {
	for {
		fetches := w.cl.PollFetches(ctx)
		for _, rec := range fetches.Records() {
			var o order
			if err := decode(rec.Value, &o); err != nil {
				continue
			}
			if err := w.store.saveOrder(ctx, o); err != nil {
				return err
			}
		}
		w.cl.CommitUncommittedOffsets(ctx)
	}
}

type account struct{ db *sql.DB }

func (a *account) credit(ctx context.Context, key []byte) {
	a.db.ExecContext(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = $1", key) // want "without deduplication"
}

func (a *account) consume(ctx context.Context, r *kafka.Reader) {
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return
		}
		a.credit(ctx, m.Key)
		r.CommitMessages(ctx, m)
	}
}

// franz-go's EachPartition hands its callback a FetchTopicPartition.
func (w *worker) partition(ctx context.Context, p kgo.FetchTopicPartition) {
	for _, r := range p.Records {
		w.store.pool.Exec(ctx, "UPDATE stock SET n = n - 1 WHERE sku = $1", r.Key) // want "without deduplication"
	}
}

func (w *worker) runPartitions(ctx context.Context) {
	for {
		w.cl.PollFetches(ctx).EachPartition(func(p kgo.FetchTopicPartition) {
			w.partition(ctx, p)
		})
	}
}

// A decoder of another package that fills in a pointer (proto.Unmarshal).
type protoConsumer struct{ store *store }

func (c *protoConsumer) apply(ctx context.Context, o *order) {
	c.store.pool.Exec(ctx, "UPDATE accounts SET balance = balance + $2 WHERE id = $1", o.ID, o.Amount) // want "without deduplication"
}

func (c *protoConsumer) run(ctx context.Context, r *kafka.Reader) {
	for {
		m, _ := r.FetchMessage(ctx)
		o := &order{}
		if json.Unmarshal(m.Value, o) == nil {
			c.apply(ctx, o)
		}
	}
}

// Not reported: what is called with something not derived from a record
// (a count, the client, the receiver whose field holds the last offset),
// and the error of a decode, which is no record.

func (w *worker) logError(ctx context.Context, err error) {
	w.store.pool.Exec(ctx, "INSERT INTO consumer_errors (msg) VALUES ($1)", err.Error())
}

func (w *worker) heartbeat(ctx context.Context, n int) {
	w.store.pool.Exec(ctx, "UPDATE consumers SET seen = now(), polled = $1", n)
}

func (w *worker) runQuiet(ctx context.Context) {
	for {
		fs := w.cl.PollFetches(ctx)
		w.heartbeat(ctx, len(fs.Records()))
		for _, rec := range fs.Records() {
			var o order
			if err := decode(rec.Value, &o); err != nil {
				w.logError(ctx, err)
			}
		}
	}
}

type offsets struct {
	pool *pgxpool.Pool
	last int64
}

func (c *offsets) flush(ctx context.Context) {
	c.pool.Exec(ctx, "UPDATE progress SET n = n + 1")
}

func (c *offsets) run(ctx context.Context, r *kafka.Reader) {
	for {
		m, _ := r.FetchMessage(ctx)
		c.last = m.Offset
		c.flush(ctx)
	}
}

// A write through Query or QueryRow (INSERT ... RETURNING, as pgx code
// often inserts) is a write too; a read is not.
func returning(ctx context.Context, cl *kgo.Client, pool *pgxpool.Pool) {
	for _, r := range cl.PollFetches(ctx).Records() {
		var id int64
		pool.QueryRow(ctx, "SELECT id FROM accounts WHERE key = $1", r.Key).Scan(&id)
		pool.QueryRow(ctx, "INSERT INTO payments (key, account) VALUES ($1, $2) RETURNING id", r.Key, id).Scan(&id) // want "without deduplication"
	}
}
