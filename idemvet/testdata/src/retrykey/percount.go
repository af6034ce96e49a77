package retrykey

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemclient"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A loop over a count that makes one operation per count: it never leaves
// the loop once a send succeeded, only when one fails. Not reported.

func perCountStopOnError(c *idemclient.Client, mk func(int) *http.Request, n int) error {
	for i := 0; i < n; i++ {
		key, err := idemclient.NewKey()
		if err != nil {
			return err
		}
		r, _ := idemclient.WithKey(mk(i), key)
		resp, err := c.Do(r)
		if err != nil {
			return fmt.Errorf("order %d: %w", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode >= 300 {
			return fmt.Errorf("order %d: status %d", i, resp.StatusCode)
		}
	}
	return nil
}

func perCountNoExit(ctx context.Context, cl *kgo.Client, n int) {
	for i := range n {
		id, _ := event.NewID()
		if err := cl.ProduceSync(ctx, &kgo.Record{Key: id[:], Value: []byte{byte(i)}}).FirstErr(); err != nil {
			log.Print(err)
		}
	}
}

var errRejected = errors.New("rejected")

func perCountBreakOnError(c *http.Client, mk func(int) *http.Request, n int) error {
	var failed error
	for i := 0; i < n; i++ {
		req := mk(i)
		req.Header.Set("Idempotency-Key", uuid.NewString())
		resp, err := c.Do(req)
		if err != nil {
			failed = err
			break
		}
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK, http.StatusCreated:
			continue
		case http.StatusUnprocessableEntity:
			break // the switch's
		default:
			return errRejected
		}
	}
	return failed
}

func perCountStatus(c *http.Client, mk func(int) *http.Request, n int) error {
	for i := 0; i < n; i++ {
		req := mk(i)
		req.Header.Set("Idempotency-Key", uuid.NewString())
		resp, err := c.Do(req)
		if err != nil || resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("order %d: %v", i, err)
		}
		resp.Body.Close()
	}
	return nil
}

// A periodic job that sleeps between runs and stops when cancelled.
func periodicSleep(ctx context.Context, c *idemclient.Client, mk func() *http.Request) {
	for {
		key, _ := idemclient.NewKey()
		r, _ := idemclient.WithKey(mk(), key)
		c.Do(r)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Minute):
		}
	}
}

func periodicCtxErr(ctx context.Context, cl *kgo.Client) error {
	for {
		id, _ := event.NewID()
		cl.ProduceSync(ctx, &kgo.Record{Key: id[:]})
		time.Sleep(time.Minute)
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// Still reported: each of these leaves the loop once a send succeeded.

func retryBreakOnSuccess(c *idemclient.Client, req *http.Request) error {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		key, _ := idemclient.NewKey() // want "idempotency key created inside a retry loop"
		r, _ := idemclient.WithKey(req, key)
		if _, err = c.Do(r); err != nil {
			time.Sleep(time.Second)
			continue
		}
		break
	}
	return err
}

func retryReturnAfterContinue(c *http.Client, req *http.Request) (*http.Response, error) {
	for attempt := 0; ; attempt++ {
		req.Header.Set("Idempotency-Key", uuid.NewString()) // want "idempotency key created inside a retry loop"
		resp, err := c.Do(req)
		if err != nil {
			if attempt == 2 {
				return nil, err
			}
			continue
		}
		return resp, nil
	}
}

func retryElse(c *idemclient.Client, req *http.Request) {
	for range 3 {
		key, _ := idemclient.NewKey() // want "idempotency key created inside a retry loop"
		r, _ := idemclient.WithKey(req, key)
		if _, err := c.Do(r); err != nil {
			log.Print(err)
		} else {
			return
		}
	}
}

func retryFlag(c *idemclient.Client, req *http.Request) {
	done := false
	for attempt := 0; attempt < 3 && !done; attempt++ {
		key, _ := idemclient.NewKey() // want "idempotency key created inside a retry loop"
		r, _ := idemclient.WithKey(req, key)
		if _, err := c.Do(r); err == nil {
			done = true
		}
	}
}

func retryLabelledBreak(ctx context.Context, cl *kgo.Client) {
attempts:
	for attempt := 0; attempt < 3; attempt++ {
		id, _ := event.NewID() // want "idempotency key created inside a retry loop"
		err := cl.ProduceSync(ctx, &kgo.Record{Key: id[:]}).FirstErr()
		switch {
		case err == nil:
			break attempts
		case errors.Is(err, context.Canceled):
			return
		}
	}
}

func retryStatus(c *http.Client, req *http.Request) error {
	for attempt := 0; attempt < 3; attempt++ {
		req.Header.Set("Idempotency-Key", uuid.NewString()) // want "idempotency key created inside a retry loop"
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode < 500 {
			return nil
		}
	}
	return errRejected
}

var errDuplicate = errors.New("duplicate")

func retryOr(c *idemclient.Client, req *http.Request) error {
	for attempt := 0; attempt < 3; attempt++ {
		key, _ := idemclient.NewKey() // want "idempotency key created inside a retry loop"
		r, _ := idemclient.WithKey(req, key)
		_, err := c.Do(r)
		if err == nil || errors.Is(err, errDuplicate) {
			return nil
		}
	}
	return errRejected
}

func retryCaseList(c *idemclient.Client, req *http.Request) error {
	for attempt := 0; attempt < 3; attempt++ {
		key, _ := idemclient.NewKey() // want "idempotency key created inside a retry loop"
		r, _ := idemclient.WithKey(req, key)
		_, err := c.Do(r)
		switch {
		case err == nil, errors.Is(err, errDuplicate):
			return nil
		case errors.Is(err, context.Canceled):
			return err
		}
	}
	return errRejected
}

func retryContinueOuter(ctx context.Context, cl *kgo.Client, topics []string) {
topics:
	for _, topic := range topics {
		for attempt := 0; attempt < 3; attempt++ {
			id, _ := event.NewID() // want "idempotency key created inside a retry loop"
			if cl.ProduceSync(ctx, &kgo.Record{Key: append([]byte(topic), id[:]...)}).FirstErr() == nil {
				continue topics
			}
		}
	}
}
