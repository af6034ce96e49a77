// Package idiomatic is idem code written as the documentation says; no
// analyzer reports in it.
package idiomatic

import (
	"bytes"
	"context"
	"net/http"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/inbox"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

type Order struct {
	ID          int64  `json:"id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

func producer() (*kgo.Client, error) {
	return kgo.NewClient(kgo.SeedBrokers("k:9092"), kgo.RequiredAcks(kgo.AllISRAcks()))
}

// Create runs behind idemhttp in ModeTx.
func Create(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, ok := idemhttp.TxFromContext[pgx.Tx](ctx)
	if !ok {
		http.Error(w, "no transaction", http.StatusInternalServerError)
		return
	}
	var o Order
	if err := tx.QueryRow(ctx, "INSERT INTO orders (amount_cents) VALUES ($1) RETURNING id", o.AmountCents).Scan(&o.ID); err != nil {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	e, err := event.New("OrderCreated.v1", "o-1", o)
	if err != nil {
		http.Error(w, "bad event", http.StatusInternalServerError)
		return
	}
	if _, err := tx.Exec(ctx, "INSERT INTO outbox (id, payload) VALUES ($1, $2)", e.ID, e.Payload); err != nil {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusCreated)
}

func pay(ctx context.Context, c *idemclient.Client, body []byte) error {
	key, err := idemclient.NewKey()
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://payments/v1/payments", bytes.NewReader(body))
	if err != nil {
		return err
	}
	if req, err = idemclient.WithKey(req, key); err != nil {
		return err
	}
	resp, err := c.Do(req) // the client retries with the same key
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

func consume(ctx context.Context, cl *kgo.Client, in *inbox.Inbox[pgx.Tx]) {
	for ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			e := event.Envelope{ID: event.DerivedID([16]byte{}, string(r.Key))}
			in.Process(ctx, e.ID, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "UPDATE accounts SET balance_cents = balance_cents + $1", 100)
				return err
			})
		})
	}
}
