package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemhttp"
)

// paymentRequest is the command every scenario serves.
type paymentRequest struct {
	CustomerID int64  `json:"customer_id"`
	Amount     string `json:"amount"`
	Currency   string `json:"currency"`
}

// paymentBody is the request body of command number n. It is a pure function
// of n, so a replay of n's key sends the same bytes.
func paymentBody(n int64) []byte {
	return fmt.Appendf(nil, `{"customer_id":%d,"amount":"%d.%02d","currency":"EUR"}`, n%1000+1, 10+n%90, n%100)
}

// insertPaymentSQL is the business effect's statement ($1 the key, then
// the command's customer, amount and currency); it returns the row's id and
// stored amount.
const insertPaymentSQL = `INSERT INTO payment (idem_key, customer_id, amount, currency)
		VALUES ($1, $2, $3::numeric, $4) RETURNING id, amount::text`

// insertPayment is the business effect: one INSERT, in tx.
func insertPayment(ctx context.Context, tx pgx.Tx, key string, p *paymentRequest) ([]byte, error) {
	var (
		id     int64
		amount string
	)
	if err := tx.QueryRow(ctx, insertPaymentSQL, key, p.CustomerID, p.Amount, p.Currency).Scan(&id, &amount); err != nil {
		return nil, err
	}
	return paymentCreated(id, amount, p), nil
}

// paymentCreated is the 201 body of the payment id, stored with amount.
func paymentCreated(id int64, amount string, p *paymentRequest) []byte {
	return fmt.Appendf(nil, `{"id":%d,"status":"created","customer_id":%d,"amount":%s,"currency":%s}`+"\n",
		id, p.CustomerID, strconv.Quote(amount), strconv.Quote(p.Currency))
}

// servePayment decodes the command, runs insertPayment in tx and answers
// 201. It is the handler body shared by every PostgreSQL scenario.
func servePayment(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
	return serveWith(w, r, func(ctx context.Context, key string, p *paymentRequest) ([]byte, error) {
		return insertPayment(ctx, tx, key, p)
	})
}

// serveWith decodes the command, runs insert and answers 201 with its body.
func serveWith(w http.ResponseWriter, r *http.Request, insert func(ctx context.Context, key string, p *paymentRequest) ([]byte, error)) error {
	var p paymentRequest
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
		http.Error(w, "bad body", http.StatusBadRequest)
		return nil //nolint:nilerr // answered 400: the client's error, not the handler's
	}
	body, err := insert(r.Context(), r.Header.Get(idemhttp.KeyHeader), &p)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(body)
	return nil
}

// bareHandler is scenario a: BEGIN; INSERT; COMMIT; 201. No idempotency.
func bareHandler(pool *pgxpool.Pool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tx, err := pool.Begin(ctx)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		// The response is buffered and written after COMMIT returned, as
		// any handler that must not announce an uncommitted effect does.
		var buf bufferedResponse
		if err := servePayment(&buf, r, tx); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if err := tx.Commit(ctx); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		buf.writeTo(w)
	})
}

// idemBusinessHandler is the handler behind idemhttp in ModeTx: the same
// INSERT, in the middleware's transaction, which it must not commit.
func idemBusinessHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok := idemhttp.TxFromContext[pgx.Tx](r.Context())
		if !ok {
			http.Error(w, "no transaction in context", http.StatusInternalServerError)
			return
		}
		if err := servePayment(w, r, tx); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
}

// naiveMiddleware is a naive check-then-execute interceptor, as often
// written by hand: SELECT the record by key; found: replay it (or 409 when the
// body hash differs); not found: run the handler, then save the response in
// a separate statement, ignoring errors. Check-then-execute: nothing stops
// two concurrent requests with one key from both executing.
func naiveMiddleware(pool *pgxpool.Pool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		key := r.Header.Get(idemhttp.KeyHeader)
		if key == "" {
			http.Error(w, "Idempotency-Key header required", http.StatusBadRequest)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "unreadable body", http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		sum := sha256.Sum256(body) // computeHash(request.body)
		hash := hex.EncodeToString(sum[:])

		var (
			storedHash   string
			storedStatus int32
			storedBody   []byte
		)
		err = pool.QueryRow(ctx, `SELECT command_hash, http_status, response
			FROM naive_idempotency_record WHERE idempotency_key = $1`, key).
			Scan(&storedHash, &storedStatus, &storedBody)
		switch {
		case err == nil:
			if storedHash != hash {
				http.Error(w, "Idempotency-Key already used with different payload", http.StatusConflict)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(int(storedStatus))
			_, _ = w.Write(storedBody)
			return
		case !errors.Is(err, pgx.ErrNoRows):
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}

		tee := &teeWriter{ResponseWriter: w}
		next.ServeHTTP(tee, r)
		if tee.status() >= 400 { // tap() only sees successful emissions
			return
		}
		// A naive interceptor saves after the handler, and nobody
		// awaits or checks it. Here it is awaited (the client sees the
		// response after it), which only narrows the window.
		_, _ = pool.Exec(context.WithoutCancel(ctx), `INSERT INTO naive_idempotency_record
			(idempotency_key, command_hash, response, http_status) VALUES ($1, $2, $3, $4)`,
			key, hash, tee.body.Bytes(), tee.status())
	})
}

// floorHandler is scenario z (read true) and y (read false): the least
// database work of any design that answers a retry from a record stored
// in the effect's transaction. z reads the key's record first (one round
// trip, no transaction), as any design must that never runs the handler
// for a replay; then BEGIN goes out with the effect's INSERT, and the
// completed record (idem's columns, in a table with idem's indexes) with
// COMMIT: the bare handler's round trips. y skips the read, so it runs the
// handler for every replay (the record's INSERT fails, the transaction
// rolls back, the stored answer would be read then): one round trip less
// than the bare handler. Neither locks the key, keeps an in-progress
// state or a cache, or canonicalises JSON (a SHA-256 of the raw body); two
// concurrent requests with one key both run the effect and the second
// fails at its record's INSERT. Not designs to ship: z/a is the ceiling of
// b/a for a middleware that never runs the handler for a replay.
func floorHandler(pool *pgxpool.Pool, read bool) http.Handler {
	headers := []byte("Content-Type: application/json\r\n")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		key := r.Header.Get(idemhttp.KeyHeader)
		raw, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "unreadable body", http.StatusBadRequest)
			return
		}
		sum := sha256.Sum256(raw)
		var p paymentRequest
		if err := json.Unmarshal(raw, &p); err != nil {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		conn, err := pool.Acquire(ctx)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer conn.Release()
		if read {
			var one int
			switch err := conn.QueryRow(ctx, `SELECT 1 FROM floor_record WHERE scope = $1 AND idempotency_key = $2`,
				"bench-client", key).Scan(&one); {
			case err == nil:
				http.Error(w, "key seen: z sends new keys only", http.StatusConflict)
				return
			case !errors.Is(err, pgx.ErrNoRows):
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		var (
			id     int64
			amount string
		)
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue(insertPaymentSQL, key, p.CustomerID, p.Amount, p.Currency).
			QueryRow(func(row pgx.Row) error { return row.Scan(&id, &amount) })
		if err := conn.SendBatch(ctx, b).Close(); err != nil {
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		body := paymentCreated(id, amount, &p)
		now := time.Now()
		b = &pgx.Batch{}
		b.Queue(`INSERT INTO floor_record (scope, idempotency_key, fingerprint, state, http_status, headers, body, created_at, expires_at)
			VALUES ($1, $2, $3, 'completed', $4, $5, $6, $7, $8)`,
			"bench-client", key, sum[:], http.StatusCreated, headers, body, now, now.Add(24*time.Hour))
		b.Queue("COMMIT")
		if err := conn.SendBatch(ctx, b).Close(); err != nil {
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
	})
}

// teeWriter passes a response through and keeps a copy.
type teeWriter struct {
	http.ResponseWriter
	code int
	body bytes.Buffer
}

func (t *teeWriter) WriteHeader(code int) {
	if t.code == 0 {
		t.code = code
	}
	t.ResponseWriter.WriteHeader(code)
}

func (t *teeWriter) Write(p []byte) (int, error) {
	if t.code == 0 {
		t.code = http.StatusOK
	}
	t.body.Write(p)
	return t.ResponseWriter.Write(p)
}

func (t *teeWriter) status() int {
	if t.code == 0 {
		return http.StatusOK
	}
	return t.code
}

// bufferedResponse holds a response until the transaction committed.
type bufferedResponse struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (b *bufferedResponse) Header() http.Header {
	if b.header == nil {
		b.header = make(http.Header)
	}
	return b.header
}

func (b *bufferedResponse) WriteHeader(code int) {
	if b.code == 0 {
		b.code = code
	}
}

func (b *bufferedResponse) Write(p []byte) (int, error) {
	if b.code == 0 {
		b.code = http.StatusOK
	}
	return b.body.Write(p)
}

func (b *bufferedResponse) writeTo(w http.ResponseWriter) {
	for k, v := range b.header {
		w.Header()[k] = v
	}
	if b.code == 0 {
		b.code = http.StatusOK
	}
	w.WriteHeader(b.code)
	_, _ = w.Write(b.body.Bytes())
}

// principal is every middleware's Config.Scope: the bench has one client,
// as an authentication middleware would name it.
func principal(*http.Request) (string, error) { return "bench-client", nil }
