package retrykey

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemclient"
	"github.com/twmb/franz-go/pkg/kgo"
)

func headerInLoop(c *http.Client, body []byte) error {
	for attempt := 0; attempt < 3; attempt++ {
		req, _ := http.NewRequest("POST", "http://x/orders", bytes.NewReader(body))
		req.Header.Set("Idempotency-Key", uuid.NewString()) // want "idempotency key created inside a retry loop"
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			return nil
		}
		time.Sleep(time.Second)
	}
	return nil
}

// X-Idempotency-Key, the name some payment APIs use, is the key too.
func xHeaderInLoop(c *http.Client, body []byte) error {
	for attempt := 0; attempt < 3; attempt++ {
		req, _ := http.NewRequest("POST", "http://x/payments", bytes.NewReader(body))
		req.Header.Set("X-Request-Id", uuid.NewString())
		req.Header.Add("x-idempotency-key", uuid.New().String()) // want "idempotency key created inside a retry loop"
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			return nil
		}
		time.Sleep(time.Second)
	}
	return nil
}

// A per-attempt request ID beside a stored X-Idempotency-Key: not reported.
func xHeaderStored(c *http.Client, body []byte, key string) error {
	for attempt := 0; attempt < 3; attempt++ {
		req, _ := http.NewRequest("POST", "http://x/payments", bytes.NewReader(body))
		req.Header.Set("X-Request-Id", uuid.NewString())
		req.Header.Set("X-Idempotency-Key", key)
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			return nil
		}
		time.Sleep(time.Second)
	}
	return nil
}

func endless(c *idemclient.Client, req *http.Request) {
	for {
		key, _ := idemclient.NewKey() // want "idempotency key created inside a retry loop"
		r, _ := idemclient.WithKey(req, key)
		if _, err := c.Do(r); err == nil {
			return
		}
	}
}

func clientKey(c *idemclient.Client, req *http.Request) {
	for range 5 {
		key, _ := c.NewKey() // want "idempotency key created inside a retry loop"
		req.Header.Set(idemclient.HeaderKey, key)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			return
		}
	}
}

func eventInLoop(ctx context.Context, cl *kgo.Client) {
	for ctx.Err() == nil {
		id, _ := event.NewID() // want "idempotency key created inside a retry loop"
		rec := &kgo.Record{Key: id[:]}
		if err := cl.ProduceSync(ctx, rec); err == nil {
			return
		}
	}
}

func backoffSelect(ctx context.Context, c *http.Client, req *http.Request) {
	for i := 0; i < 3; i++ {
		req.Header.Set("Idempotency-Key", uuid.New().String()) // want "idempotency key created inside a retry loop"
		if _, err := c.Do(req); err == nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func uuidThroughVariables(c *http.Client, req *http.Request) {
	for attempt := 0; attempt < 3; attempt++ {
		id := uuid.New() // want "idempotency key created inside a retry loop"
		key := "order-" + id.String()
		req.Header.Set("idempotency-key", key)
		req.Header.Set("X-Request-Id", uuid.NewString())
		if _, err := c.Do(req); err == nil {
			return
		}
	}
}

func uuidWithKey(c *idemclient.Client, req *http.Request) {
	for {
		r, _ := idemclient.WithKey(req, uuid.Must(uuid.NewRandom()).String()) // want "idempotency key created inside a retry loop"
		if _, err := c.Do(r); err == nil {
			return
		}
	}
}

func eventInProduceLoop(ctx context.Context, cl *kgo.Client) {
	for ctx.Err() == nil {
		e, _ := event.New("X.v1", "k", nil) // want "idempotency key created inside a retry loop"
		if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte(e.Key)}); err == nil {
			return
		}
	}
}

// Every constructor of github.com/google/uuid makes a new value: NewUUID
// (version 1) and the FromReader forms too.
func uuidV1Key(c *http.Client, req *http.Request) {
	for attempt := 0; attempt < 3; attempt++ {
		id, _ := uuid.NewUUID() // want "idempotency key created inside a retry loop"
		req.Header.Set("Idempotency-Key", id.String())
		if _, err := c.Do(req); err == nil {
			return
		}
	}
}

func uuidReaderKeys(c *http.Client, req *http.Request) {
	for attempt := 0; attempt < 3; attempt++ {
		a, _ := uuid.NewRandomFromReader(rand.Reader) // want "idempotency key created inside a retry loop"
		b, _ := uuid.NewV7FromReader(rand.Reader)     // want "idempotency key created inside a retry loop"
		req.Header.Set("Idempotency-Key", a.String()+b.String())
		if _, err := c.Do(req); err == nil {
			return
		}
	}
}

// A Timer between attempts is a backoff, not the next unit of work.
func timerBackoff(c *idemclient.Client, req *http.Request) {
	t := time.NewTimer(time.Second)
	for {
		key, _ := idemclient.NewKey() // want "idempotency key created inside a retry loop"
		r, _ := idemclient.WithKey(req, key)
		if _, err := c.Do(r); err == nil {
			return
		}
		<-t.C
		t.Reset(time.Second)
	}
}

// Not reported.

// stableKeyRequestID is the right pattern: one key for the operation, a
// fresh request ID per attempt.
func stableKeyRequestID(c *http.Client, req *http.Request) error {
	key, err := idemclient.NewKey()
	if err != nil {
		return err
	}
	for attempt := 0; attempt < 3; attempt++ {
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("X-Request-Id", uuid.NewString())
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
			return nil
		}
	}
	return nil
}

func stableKeyTraceVar(c *idemclient.Client, req *http.Request, key string) {
	for attempt := 0; attempt < 3; attempt++ {
		trace := uuid.New().String()
		r, _ := idemclient.WithKey(req, key)
		r.Header.Add("X-Trace-Id", trace)
		if _, err := c.Do(r); err == nil {
			return
		}
	}
}

type stableOpts struct{ key string }

// The key is a field set once, before the loop; the UUID is a request ID.
func stableFieldKey(c *http.Client, req *http.Request) error {
	var o stableOpts
	var err error
	o.key, err = idemclient.NewKey()
	if err != nil {
		return err
	}
	for attempt := 0; attempt < 3; attempt++ {
		req.Header.Set("Idempotency-Key", o.key[:])
		req.Header.Set("X-Request-Id", uuid.NewString())
		if _, err := c.Do(req); err == nil {
			return nil
		}
	}
	return nil
}

func keyBeforeLoop(c *http.Client, body []byte) error {
	key, err := idemclient.NewKey()
	if err != nil {
		return err
	}
	for attempt := 0; attempt < 3; attempt++ {
		req, _ := http.NewRequest("POST", "http://x/orders", bytes.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			return nil
		}
	}
	return nil
}

func perItem(c *idemclient.Client, reqs []*http.Request) {
	for _, req := range reqs {
		key, _ := idemclient.NewKey()
		r, _ := idemclient.WithKey(req, key)
		c.Do(r)
	}
}

func perItemIndex(c *idemclient.Client, reqs []*http.Request) {
	for i := 0; i < len(reqs); i++ {
		key, _ := idemclient.NewKey()
		r, _ := idemclient.WithKey(reqs[i], key)
		c.Do(r)
	}
}

// Range over len (Go 1.22), and a bound computed from len: one operation
// per item, as for i < len(reqs).
func perItemRangeLen(c *idemclient.Client, reqs []*http.Request) {
	for i := range len(reqs) {
		key, _ := idemclient.NewKey()
		r, _ := idemclient.WithKey(reqs[i], key)
		c.Do(r)
	}
}

func perItemLenVariable(ctx context.Context, cl *kgo.Client, keys [][]byte) {
	n := len(keys)
	for i := 0; i < n; i++ {
		id, _ := event.NewID()
		cl.ProduceSync(ctx, &kgo.Record{Key: keys[i], Value: id[:]})
	}
}

func worker(c *idemclient.Client, jobs <-chan *http.Request) {
	for {
		req := <-jobs
		key, _ := idemclient.NewKey()
		r, _ := idemclient.WithKey(req, key)
		c.Do(r)
	}
}

func traceID(c *http.Client, req *http.Request) {
	for attempt := 0; attempt < 3; attempt++ {
		req.Header.Set("X-Request-Id", uuid.NewString())
		if _, err := c.Do(req); err == nil {
			return
		}
	}
}

func noSend() []string {
	var keys []string
	for i := 0; i < 10; i++ {
		k, _ := idemclient.NewKey()
		keys = append(keys, k)
	}
	return keys
}

func nestedItems(c *idemclient.Client, reqs []*http.Request) {
	for attempt := 0; attempt < 3; attempt++ {
		for _, req := range reqs {
			key, _ := idemclient.NewKey()
			r, _ := idemclient.WithKey(req, key)
			c.Do(r)
		}
	}
}

func polling(ctx context.Context, cl *kgo.Client) {
	for {
		fs := cl.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) {
			e, _ := event.New("OrderSeen.v1", string(r.Key), nil)
			cl.ProduceSync(ctx, &kgo.Record{Key: []byte(e.Key)})
		})
	}
}

// ticker is a periodic job: each tick is a new operation.
func ticker(ctx context.Context, c *idemclient.Client, mk func() *http.Request) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		key, _ := idemclient.NewKey()
		r, _ := idemclient.WithKey(mk(), key)
		c.Do(r)
	}
}

type job struct{ *time.Ticker }

func tickerEmbedded(ctx context.Context, j job, cl *kgo.Client) {
	for ctx.Err() == nil {
		<-j.C
		id, _ := event.NewID()
		cl.ProduceSync(ctx, &kgo.Record{Key: id[:]})
	}
}

func tick(ctx context.Context, cl *kgo.Client) {
	every := time.Tick(time.Minute)
	for {
		select {
		case <-ctx.Done():
			return
		case <-every:
			id, _ := event.NewID()
			cl.ProduceSync(ctx, &kgo.Record{Key: id[:]})
		}
	}
}

type reviewOpts struct{ key string }

func reviewFieldKey(c *http.Client, body []byte) {
	var o reviewOpts
	for attempt := 0; attempt < 3; attempt++ {
		o.key = uuid.NewString() // want "idempotency key created inside a retry loop"
		req, _ := http.NewRequest("POST", "http://x/orders", bytes.NewReader(body))
		req.Header.Set("Idempotency-Key", o.key)
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
			return
		}
	}
}

func reviewSliceKey(c *http.Client, body []byte) {
	for attempt := 0; attempt < 3; attempt++ {
		id := uuid.New() // want "idempotency key created inside a retry loop"
		req, _ := http.NewRequest("POST", "http://x/orders", bytes.NewReader(body))
		req.Header.Set("Idempotency-Key", string(id.String()[:8]))
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
			return
		}
	}
}

func hexKey(c *http.Client, req *http.Request) {
	for attempt := 0; attempt < 3; attempt++ {
		id := uuid.New() // want "idempotency key created inside a retry loop"
		req.Header.Set("Idempotency-Key", hex.EncodeToString(id[:]))
		if _, err := c.Do(req); err == nil {
			return
		}
	}
}

func literalFieldKey(c *http.Client, req *http.Request) {
	for attempt := 0; attempt < 3; attempt++ {
		o := &reviewOpts{key: uuid.NewString()} // want "idempotency key created inside a retry loop"
		req.Header.Set("Idempotency-Key", o.key)
		if _, err := c.Do(req); err == nil {
			return
		}
	}
}

type setterOpts struct{ key string }

func (o *setterOpts) setKey(k string) { o.key = k }

// The key reaches the header through a setter the rule does not follow:
// every UUID of the loop counts, as when the loop sets a key.
func setterKey(c *http.Client, req *http.Request) {
	var o setterOpts
	for attempt := 0; attempt < 3; attempt++ {
		o.setKey(uuid.NewString()) // want "idempotency key created inside a retry loop"
		req.Header.Set("Idempotency-Key", o.key)
		if _, err := c.Do(req); err == nil {
			return
		}
	}
}

func mapKey(c *http.Client, req *http.Request) {
	keys := map[string]string{}
	for attempt := 0; attempt < 3; attempt++ {
		keys["order"] = uuid.NewString() // want "idempotency key created inside a retry loop"
		req.Header.Set("Idempotency-Key", keys["order"])
		if _, err := c.Do(req); err == nil {
			return
		}
	}
}

type payments struct {
	c  *http.Client
	cl *kgo.Client
}

// charge builds the request and sends it: the loops below send through it.
func (p *payments) charge(ctx context.Context, key string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, "POST", "http://psp/charges", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", key)
	return p.do(req)
}

func (p *payments) do(req *http.Request) error {
	resp, err := p.c.Do(req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

func publish(ctx context.Context, cl *kgo.Client, id []byte) error {
	return cl.ProduceSync(ctx, &kgo.Record{Key: id}).FirstErr()
}

func helperSends(ctx context.Context, p *payments, body []byte) error {
	for attempt := 0; attempt < 3; attempt++ {
		key, _ := idemclient.NewKey() // want "idempotency key created inside a retry loop"
		if err := p.charge(ctx, key, body); err == nil {
			return nil
		}
		time.Sleep(time.Second)
	}
	return nil
}

func helperSendsUUID(ctx context.Context, p *payments, body []byte) error {
	for attempt := 0; attempt < 3; attempt++ {
		if err := p.charge(ctx, uuid.NewString(), body); err == nil { // want "idempotency key created inside a retry loop"
			return nil
		}
	}
	return nil
}

func helperPublishes(ctx context.Context, cl *kgo.Client) {
	for ctx.Err() == nil {
		id, _ := event.NewID() // want "idempotency key created inside a retry loop"
		if publish(ctx, cl, id[:]) == nil {
			return
		}
	}
}

// Not reported: the key is made once; the per-attempt UUID is a request
// ID the helper does not send as the key.
func helperStableKey(ctx context.Context, p *payments, body []byte) error {
	key, err := idemclient.NewKey()
	if err != nil {
		return err
	}
	for attempt := 0; attempt < 3; attempt++ {
		trace := uuid.NewString()
		if err := p.charge(context.WithValue(ctx, traceKey{}, trace), key, body); err == nil {
			return nil
		}
	}
	return nil
}

type traceKey struct{}
