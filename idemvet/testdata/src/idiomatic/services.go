package idiomatic

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/idemkit/idem/idemhttp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Services written by the rules without idem's packages: none of them is
// reported.

type payment struct {
	ID     string
	Amount int64
}

type repo struct{ pool *pgxpool.Pool }

func (r *repo) claim(ctx context.Context, tx pgx.Tx, id []byte) (bool, error) {
	tag, err := tx.Exec(ctx, "INSERT INTO processed_event (id) VALUES ($1) ON CONFLICT DO NOTHING", id)
	return tag.RowsAffected() == 1, err
}

func (r *repo) save(ctx context.Context, tx pgx.Tx, p payment) error {
	_, err := tx.Exec(ctx, "INSERT INTO payment (id, amount) VALUES ($1, $2)", p.ID, p.Amount)
	return err
}

func (r *repo) read(ctx context.Context, id string) (payment, error) {
	var p payment
	err := r.pool.QueryRow(ctx, "SELECT id, amount FROM payment WHERE id = $1", id).Scan(&p.ID, &p.Amount)
	return p, err
}

// A sarama handler: dedup row and effect in one transaction, marked after
// the commit.
type ledger struct{ repo *repo }

func (h *ledger) apply(ctx context.Context, msg *sarama.ConsumerMessage) error {
	var p payment
	if err := json.Unmarshal(msg.Value, &p); err != nil {
		return err
	}
	tx, err := h.repo.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if fresh, err := h.repo.claim(ctx, tx, msg.Key); err != nil || !fresh {
		return err
	}
	if err := h.repo.save(ctx, tx, p); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func (h *ledger) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		if err := h.apply(sess.Context(), msg); err != nil {
			return err
		}
		sess.MarkMessage(msg, "")
	}
	return nil
}

// A kgo consumer with manual commits, a poll's records applied by workers
// that are waited for before the commit.
func (h *ledger) fanOut(ctx context.Context, cl *kgo.Client, handle func(context.Context, *kgo.Record) error) {
	for {
		fs := cl.PollFetches(ctx)
		var wg sync.WaitGroup
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, r := range p.Records {
					_ = handle(ctx, r)
				}
			}()
		})
		wg.Wait()
		if err := cl.CommitUncommittedOffsets(ctx); err != nil {
			return
		}
	}
}

func newConsumer(group string) (*kgo.Client, error) {
	return kgo.NewClient(kgo.ConsumerGroup(group), kgo.ConsumeTopics("payments"), kgo.DisableAutoCommit())
}

// An API client whose request helper sets the key it is given, made once
// per operation before the retry loop.
type api struct {
	http *http.Client
	url  string
}

func (a *api) newRequest(ctx context.Context, key string, body []byte) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Request-Id", uuid.NewString())
	return req, nil
}

func (a *api) pay(ctx context.Context, body []byte) (*http.Response, error) {
	key := uuid.Must(uuid.NewV7()).String()
	for {
		req, err := a.newRequest(ctx, key, body)
		if err != nil {
			return nil, err
		}
		resp, err := a.http.Do(req)
		if err == nil {
			return resp, nil
		}
		time.Sleep(time.Second)
	}
}

// A handler writing through the request's transaction with a repository
// given it, reading through the pool.
type server struct{ repo *repo }

func (s *server) capture(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, _ := idemhttp.TxFromContext[pgx.Tx](ctx)
	p, err := s.repo.read(ctx, r.PathValue("id"))
	if err != nil {
		w.WriteHeader(http.StatusNotFound)
		return
	}
	if err := s.repo.save(ctx, tx, p); err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusCreated)
}
