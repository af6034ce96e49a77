package retrykey

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"net/http"

	"github.com/google/uuid"
	"github.com/idemkit/idem/idemclient"
)

// The pattern idem recommends: the key is made once, stored with the
// operation, and read back on every attempt, also after a restart. A fresh
// request ID per attempt is not the key.

type scannedPayment struct {
	ID             int64
	IdempotencyKey string
	Body           []byte
}

// Not reported: the key is a field filled by rows.Scan.
func storedKeyScan(ctx context.Context, db *sql.DB, c *http.Client, id int64) error {
	var p scannedPayment
	row := db.QueryRowContext(ctx, "SELECT idempotency_key, body FROM payments WHERE id = $1", id)
	if err := row.Scan(&p.IdempotencyKey, &p.Body); err != nil {
		return err
	}
	for attempt := 0; attempt < 3; attempt++ {
		req, err := http.NewRequestWithContext(ctx, "POST", "http://psp/charges", bytes.NewReader(p.Body))
		if err != nil {
			return err
		}
		req.Header.Set("Idempotency-Key", p.IdempotencyKey)
		req.Header.Set("X-Request-Id", uuid.NewString())
		if resp, err := c.Do(req); err == nil {
			return resp.Body.Close()
		}
	}
	return nil
}

type decodedOp struct {
	Key     string `json:"key"`
	Payload []byte `json:"payload"`
}

// Not reported: the key is a field filled by a decoder.
func storedKeyDecoder(c *idemclient.Client, r io.Reader) error {
	var op decodedOp
	if err := json.NewDecoder(r).Decode(&op); err != nil {
		return err
	}
	for attempt := 0; attempt < 3; attempt++ {
		req, err := http.NewRequest("POST", "http://psp/charges", bytes.NewReader(op.Payload))
		if err != nil {
			return err
		}
		req, err = idemclient.WithKey(req, op.Key)
		if err != nil {
			return err
		}
		req.Header.Set("X-Request-Id", uuid.New().String())
		if _, err := c.Do(req); err == nil {
			return nil
		}
	}
	return nil
}

type storedPayment struct {
	key  string
	body []byte
}

// newStoredPayment is where the package sets the key: from its parameter,
// before any retry loop.
func newStoredPayment(key string, body []byte) *storedPayment {
	return &storedPayment{key: key, body: body}
}

// Not reported: the key is a field of a parameter, set by the package from
// another function's parameter outside the loop.
func storedKeyParam(ctx context.Context, c *http.Client, p *storedPayment) error {
	for attempt := 0; attempt < 3; attempt++ {
		req, err := http.NewRequestWithContext(ctx, "POST", "http://psp/charges", bytes.NewReader(p.body))
		if err != nil {
			return err
		}
		req.Header.Set("Idempotency-Key", p.key)
		id, _ := uuid.NewV7()
		req.Header.Set("X-Request-Id", id.String())
		if resp, err := c.Do(req); err == nil {
			return resp.Body.Close()
		}
	}
	return nil
}

// Reported: another header carries a stored value, but the key is made
// per attempt.
func storedHeaderFreshKey(ctx context.Context, c *http.Client, p *scannedPayment) error {
	for attempt := 0; attempt < 3; attempt++ {
		req, err := http.NewRequestWithContext(ctx, "POST", "http://psp/charges", bytes.NewReader(p.Body))
		if err != nil {
			return err
		}
		req.Header.Set("X-Request-Id", p.IdempotencyKey)
		id, _ := uuid.NewV7() // want "idempotency key created inside a retry loop"
		req.Header.Set("Idempotency-Key", id.String())
		if resp, err := c.Do(req); err == nil {
			return resp.Body.Close()
		}
	}
	return nil
}

func storedHeaderNewKey(c *idemclient.Client, op *decodedOp) {
	for {
		req, _ := http.NewRequest("POST", "http://psp/charges", bytes.NewReader(op.Payload))
		req.Header.Set("X-Order-Key", op.Key)
		key, _ := idemclient.NewKey() // want "idempotency key created inside a retry loop"
		req, _ = idemclient.WithKey(req, key)
		if _, err := c.Do(req); err == nil {
			return
		}
	}
}

// Reported: a stored prefix does not make a fresh UUID a stable key; the
// request ID next to it is not the key.
func storedPrefixFreshKey(c *http.Client, p *scannedPayment) {
	for attempt := 0; attempt < 3; attempt++ {
		req, _ := http.NewRequest("POST", "http://psp/charges", bytes.NewReader(p.Body))
		req.Header.Set("Idempotency-Key", p.IdempotencyKey+"-"+uuid.NewString()) // want "idempotency key created inside a retry loop"
		req.Header.Set("X-Request-Id", uuid.NewString())
		if _, err := c.Do(req); err == nil {
			return
		}
	}
}

type relayOpts struct{ key string }

func (o *relayOpts) set(k string)   { o.key = k }
func (o *relayOpts) reset(k string) { o.set(k) }

// Reported: the key field is set from a parameter of a function the loop
// calls (through another), so the value may be made in the loop; every
// UUID of the loop counts.
func storedSetterInLoop(c *http.Client, req *http.Request) {
	var o relayOpts
	for attempt := 0; attempt < 3; attempt++ {
		o.reset(uuid.NewString()) // want "idempotency key created inside a retry loop"
		req.Header.Set("Idempotency-Key", o.key)
		if _, err := c.Do(req); err == nil {
			return
		}
	}
}
