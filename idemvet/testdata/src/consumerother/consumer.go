package consumerother

import (
	"context"
	"database/sql"

	"github.com/IBM/sarama"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/idemkit/idem/inbox"
	"github.com/jackc/pgx/v5"
)

// A sarama ConsumerGroupHandler.
type ledger struct{ db *sql.DB }

func (h *ledger) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		h.db.Exec("UPDATE accounts SET balance = balance + 1 WHERE id = $1", msg.Key) // want "kafka consumer writes to the database without deduplication"
		sess.MarkMessage(msg, "")
	}
	return nil
}

type handOff struct{ db *sql.DB }

func (h *handOff) apply(msg *sarama.ConsumerMessage) {
	h.db.Exec("INSERT INTO payments (key) VALUES ($1)", msg.Key) // want "without deduplication"
}

func (h *handOff) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		h.apply(msg)
		sess.MarkMessage(msg, "")
	}
	return nil
}

// confluent-kafka-go.
func confluentLoop(c *kafka.Consumer, db *sql.DB) {
	for {
		m, err := c.ReadMessage(100)
		if err != nil {
			continue
		}
		db.Exec("INSERT INTO orders (id) VALUES ($1)", m.Key) // want "without deduplication"
	}
}

// Not reported.

type withInbox struct{ in *inbox.Inbox[pgx.Tx] }

func (h *withInbox) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		h.in.Process(context.Background(), [16]byte{}, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = $1", msg.Key)
			return err
		})
		sess.MarkMessage(msg, "")
	}
	return nil
}

func confluentDedup(c *kafka.Consumer, db *sql.DB) {
	for {
		m, err := c.ReadMessage(100)
		if err != nil {
			continue
		}
		db.Exec("INSERT INTO orders (id) VALUES ($1) ON CONFLICT (id) DO NOTHING", m.Key)
	}
}
