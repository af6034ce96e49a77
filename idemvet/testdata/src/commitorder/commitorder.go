package commitorder

import (
	"context"
	"database/sql"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
)

func kgoCommitFirst(ctx context.Context, cl *kgo.Client, db *sql.DB) {
	for {
		fs := cl.PollFetches(ctx)
		cl.CommitRecords(ctx, fs.Records()...) // want "kafka offsets committed \\(or marked\\) before the database write"
		for _, r := range fs.Records() {
			db.ExecContext(ctx, "INSERT INTO seen (id) VALUES ($1) ON CONFLICT DO NOTHING", r.Key)
		}
	}
}

func kafkaGoCommitFirst(ctx context.Context, r *kafkago.Reader, db *sql.DB) error {
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return err
		}
		if err := r.CommitMessages(ctx, m); err != nil { // want "before the database write"
			return err
		}
		tx, _ := db.BeginTx(ctx, nil)
		tx.ExecContext(ctx, "INSERT INTO orders (id) VALUES ($1) ON CONFLICT DO NOTHING", m.Key)
		tx.Commit()
	}
}

type handler struct{ db *sql.DB }

func (h handler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		sess.MarkMessage(msg, "") // want "before the database write"
		h.db.Exec("INSERT INTO orders (id) VALUES ($1) ON CONFLICT DO NOTHING", msg.Key)
	}
	return nil
}

func confluentStoreFirst(c *kafka.Consumer, db *sql.DB) {
	for {
		m, err := c.ReadMessage(100)
		if err != nil {
			continue
		}
		c.StoreMessage(m) // want "before the database write"
		db.Exec("INSERT INTO orders (id) VALUES ($1) ON CONFLICT DO NOTHING", m.Key)
	}
}

// Not reported: the commit after the write (also when the write opens the
// next iteration), a deferred commit.

func kgoCommitAfter(ctx context.Context, cl *kgo.Client, db *sql.DB) {
	for {
		fs := cl.PollFetches(ctx)
		tx, _ := db.BeginTx(ctx, nil)
		for _, r := range fs.Records() {
			tx.ExecContext(ctx, "INSERT INTO seen (id) VALUES ($1) ON CONFLICT DO NOTHING", r.Key)
		}
		if tx.Commit() != nil {
			continue
		}
		cl.CommitRecords(ctx, fs.Records()...)
	}
}

func (h handler) markAfter(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		h.db.Exec("INSERT INTO orders (id) VALUES ($1) ON CONFLICT DO NOTHING", msg.Key)
		sess.MarkMessage(msg, "")
	}
	return nil
}

func deferred(ctx context.Context, r *kafkago.Reader, db *sql.DB, m kafkago.Message) {
	defer r.CommitMessages(ctx, m)
	db.ExecContext(ctx, "INSERT INTO orders (id) VALUES ($1) ON CONFLICT DO NOTHING", m.Key)
}

// Not reported: a record skipped (marked or committed, then the loop goes
// on to the next one or returns) before the write that applies the others.

func (h handler) skipPoison(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		if len(msg.Value) == 0 {
			sess.MarkMessage(msg, "")
			continue
		}
		if msg.Topic == "" {
			if len(msg.Key) == 0 {
				sess.MarkMessage(msg, "")
				return nil
			}
			sess.MarkMessage(msg, "")
			break
		}
		switch msg.Topic {
		case "audit":
			sess.MarkMessage(msg, "")
			continue
		}
		h.db.Exec("INSERT INTO orders (id) VALUES ($1) ON CONFLICT DO NOTHING", msg.Key)
		sess.MarkMessage(msg, "")
	}
	return nil
}

// Reported: a branch that goes on to the write, a case that breaks out of
// the switch only (a commit in an if's init is kafkaGoCommitFirst's).

func (h handler) markThenFallThrough(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		if len(msg.Value) == 0 {
			sess.MarkMessage(msg, "") // want "before the database write"
		} else {
			sess.MarkMessage(msg, "") // this branch goes on to the next record
			continue
		}
		switch msg.Topic {
		case "audit":
			sess.MarkMessage(msg, "") // want "before the database write"
			break
		}
		h.db.Exec("INSERT INTO orders (id) VALUES ($1) ON CONFLICT DO NOTHING", msg.Key)
	}
	return nil
}

// sarama's own example's shape: the claim's messages received in a select.
// The case's statements are a block of their own.
func (h handler) selectLoop(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for {
		select {
		case msg, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			sess.MarkMessage(msg, "") // want "before the database write"
			h.db.Exec("INSERT INTO orders (id) VALUES ($1) ON CONFLICT DO NOTHING", msg.Key)
		case <-sess.Context().Done():
			return nil
		}
	}
}

func (h handler) selectLoopAfter(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for {
		select {
		case msg := <-claim.Messages():
			h.db.Exec("INSERT INTO orders (id) VALUES ($1) ON CONFLICT DO NOTHING", msg.Key)
			sess.MarkMessage(msg, "")
		case <-sess.Context().Done():
			return nil
		}
	}
}

func switchCase(ctx context.Context, r *kafkago.Reader, db *sql.DB, m kafkago.Message) {
	switch m.Topic {
	case "orders":
		r.CommitMessages(ctx, m) // want "before the database write"
		db.ExecContext(ctx, "INSERT INTO orders (id) VALUES ($1) ON CONFLICT DO NOTHING", m.Key)
	}
}

// The write in a function or method of the package the loop calls after
// the mark (a handler, a repository), or in a function literal a call runs
// (a transaction helper, pgx.BeginFunc): still after the commit.

type store struct{ db *sql.DB }

func (s *store) saveOrder(ctx context.Context, id []byte) error {
	_, err := s.db.ExecContext(ctx, "INSERT INTO orders (id) VALUES ($1) ON CONFLICT DO NOTHING", id)
	return err
}

func (s *store) inTx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

type orders struct{ store *store }

func (h *orders) handle(ctx context.Context, msg *sarama.ConsumerMessage) error {
	return h.store.saveOrder(ctx, msg.Key)
}

func (h *orders) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		sess.MarkMessage(msg, "") // want "before the database write"
		if err := h.handle(sess.Context(), msg); err != nil {
			return err
		}
	}
	return nil
}

func (h *orders) commitThenTx(ctx context.Context, cl *kgo.Client) {
	for {
		recs := cl.PollFetches(ctx).Records()
		if err := cl.CommitRecords(ctx, recs...); err != nil { // want "before the database write"
			continue
		}
		h.store.inTx(ctx, func(tx *sql.Tx) error {
			for _, r := range recs {
				tx.ExecContext(ctx, "INSERT INTO orders (id) VALUES ($1) ON CONFLICT DO NOTHING", r.Key)
			}
			return nil
		})
	}
}

func commitThenBeginFunc(c *kafka.Consumer, pool *pgxpool.Pool) {
	for {
		m, err := c.ReadMessage(100)
		if err != nil {
			continue
		}
		c.CommitMessage(m) // want "before the database write"
		pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(context.Background(), "INSERT INTO orders (id) VALUES ($1) ON CONFLICT DO NOTHING", m.Key)
			return err
		})
	}
}

// Not reported: the handler that writes runs before the mark, a function
// literal started later (a goroutine, a timer), a helper that does not
// write.

func (h *orders) handleThenMark(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		if err := h.handle(sess.Context(), msg); err != nil {
			return err
		}
		sess.MarkMessage(msg, "")
		h.log(msg)
	}
	return nil
}

func (h *orders) log(msg *sarama.ConsumerMessage) {}

func (h *orders) later(ctx context.Context, r *kafkago.Reader, m kafkago.Message) {
	r.CommitMessages(ctx, m)
	time.AfterFunc(time.Second, func() {
		h.store.saveOrder(ctx, m.Key)
	})
}

// With kgo.AutoCommitMarks: the marked offsets committed by hand.
func commitMarkedFirst(ctx context.Context, cl *kgo.Client, db *sql.DB) {
	for {
		recs := cl.PollFetches(ctx).Records()
		cl.CommitMarkedOffsets(ctx) // want "before the database write"
		for _, r := range recs {
			db.ExecContext(ctx, "INSERT INTO orders (id) VALUES ($1) ON CONFLICT DO NOTHING", r.Key)
			cl.MarkCommitRecords(r)
		}
	}
}

// Records handed to other goroutines (a worker pool's channel, go
// statements), then committed or marked at once: the workers' writes may
// not have happened, and a crash loses the records.

type pool struct {
	jobs chan *sarama.ConsumerMessage
	db   *sql.DB
}

func (p *pool) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		p.jobs <- msg
		sess.MarkMessage(msg, "") // want "committed \\(or marked\\) for records handed to another goroutine"
	}
	return nil
}

func (p *pool) selectSend(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for {
		select {
		case msg := <-claim.Messages():
			select {
			case p.jobs <- msg:
			case <-sess.Context().Done():
				return nil
			}
			sess.MarkMessage(msg, "") // want "handed to another goroutine"
		case <-sess.Context().Done():
			return nil
		}
	}
}

func (p *pool) apply(ctx context.Context, r *kgo.Record) {
	p.db.ExecContext(ctx, "INSERT INTO orders (id) VALUES ($1) ON CONFLICT DO NOTHING", r.Key)
}

func (p *pool) fanOut(ctx context.Context, cl *kgo.Client) {
	for {
		fs := cl.PollFetches(ctx)
		for _, r := range fs.Records() {
			go p.apply(ctx, r)
		}
		cl.CommitUncommittedOffsets(ctx) // want "handed to another goroutine"
	}
}

func (p *pool) perPartition(ctx context.Context, cl *kgo.Client) {
	for {
		fs := cl.PollFetches(ctx)
		fs.EachPartition(func(part kgo.FetchTopicPartition) {
			go func() {
				for _, r := range part.Records {
					p.apply(ctx, r)
				}
			}()
		})
		cl.CommitUncommittedOffsets(ctx) // want "handed to another goroutine"
	}
}

// Not reported: the commit after the workers are waited for (a WaitGroup,
// an errgroup, their answers received), and a goroutine that marks its own
// record once applied.

func (p *pool) fanOutWait(ctx context.Context, cl *kgo.Client) {
	for {
		fs := cl.PollFetches(ctx)
		var wg sync.WaitGroup
		for _, r := range fs.Records() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.apply(ctx, r)
			}()
		}
		wg.Wait()
		cl.CommitUncommittedOffsets(ctx)
	}
}

func (p *pool) fanOutDone(ctx context.Context, cl *kgo.Client, done chan error) {
	for {
		recs := cl.PollFetches(ctx).Records()
		for _, r := range recs {
			go func() { p.apply(ctx, r); done <- nil }()
		}
		for range recs {
			if err := <-done; err != nil {
				return
			}
		}
		cl.CommitRecords(ctx, recs...)
	}
}

func (p *pool) markInWorker(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		go func() {
			p.db.Exec("INSERT INTO orders (id) VALUES ($1) ON CONFLICT DO NOTHING", msg.Key)
			sess.MarkMessage(msg, "")
		}()
	}
	return nil
}

func commitThenReturning(ctx context.Context, r *kafkago.Reader, pool *pgxpool.Pool) {
	for {
		m, _ := r.FetchMessage(ctx)
		r.CommitMessages(ctx, m) // want "before the database write"
		var id int64
		pool.QueryRow(ctx, "INSERT INTO orders (id) VALUES ($1) ON CONFLICT DO NOTHING RETURNING id", m.Key).Scan(&id)
	}
}

// Not reported: a read after the commit.
func commitThenRead(ctx context.Context, r *kafkago.Reader, pool *pgxpool.Pool) {
	for {
		m, _ := r.FetchMessage(ctx)
		r.CommitMessages(ctx, m)
		var n int64
		pool.QueryRow(ctx, "SELECT count(*) FROM orders").Scan(&n)
	}
}
