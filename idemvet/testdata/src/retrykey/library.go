package retrykey

import (
	"bytes"
	"context"
	"net/http"
	"time"

	"github.com/avast/retry-go/v4"
	"github.com/cenkalti/backoff/v4"
	backoffv5 "github.com/cenkalti/backoff/v5"
	"github.com/google/uuid"
	"github.com/idemkit/idem/idemclient"
	goretry "github.com/sethvargo/go-retry"
)

// A retry library runs the operation once per attempt: a key made in it is
// a new key per attempt, as in a retry loop.

func backoffRetry(c *http.Client, body []byte) error {
	return backoff.Retry(func() error {
		req, _ := http.NewRequest("POST", "http://x/orders", bytes.NewReader(body))
		req.Header.Set("Idempotency-Key", uuid.NewString()) // want "idempotency key created inside a retry loop"
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		return resp.Body.Close()
	}, backoff.NewExponentialBackOff())
}

func backoffOperationVar(c *idemclient.Client, body []byte) error {
	op := func() error {
		key, err := idemclient.NewKey() // want "idempotency key created inside a retry loop"
		if err != nil {
			return err
		}
		req, _ := http.NewRequest("POST", "http://x/orders", bytes.NewReader(body))
		req, _ = idemclient.WithKey(req, key)
		_, err = c.Do(req)
		return err
	}
	return backoff.RetryNotify(op, backoff.NewExponentialBackOff(), nil)
}

func backoffV5(ctx context.Context, c *http.Client, body []byte) (*http.Response, error) {
	return backoffv5.Retry(ctx, func() (*http.Response, error) {
		req, _ := http.NewRequest("POST", "http://x/orders", bytes.NewReader(body))
		req.Header.Set("Idempotency-Key", uuid.New().String()) // want "idempotency key created inside a retry loop"
		return c.Do(req)
	})
}

func retryGo(c *http.Client, body []byte) error {
	return retry.Do(func() error {
		req, _ := http.NewRequest("POST", "http://x/orders", bytes.NewReader(body))
		req.Header.Set("Idempotency-Key", uuid.NewString()) // want "idempotency key created inside a retry loop"
		_, err := c.Do(req)
		return err
	}, retry.Attempts(3))
}

func goRetry(ctx context.Context, c *http.Client, body []byte) error {
	b := goretry.WithMaxRetries(3, goretry.NewExponential(time.Second))
	return goretry.Do(ctx, b, func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://x/orders", bytes.NewReader(body))
		req.Header.Set("Idempotency-Key", uuid.NewString()) // want "idempotency key created inside a retry loop"
		resp, err := c.Do(req)
		if err != nil {
			return goretry.RetryableError(err)
		}
		return resp.Body.Close()
	})
}

// The backoff a function too (BackoffFunc): the operation is the argument
// of the retry function's type, not the first function.
func goRetryBackoffFunc(ctx context.Context, c *idemclient.Client, body []byte) (*http.Response, error) {
	b := goretry.BackoffFunc(func() (time.Duration, bool) { return time.Second, false })
	return goretry.DoValue(ctx, b, func(ctx context.Context) (*http.Response, error) {
		key, err := idemclient.NewKey() // want "idempotency key created inside a retry loop"
		if err != nil {
			return nil, err
		}
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://x/orders", bytes.NewReader(body))
		req, _ = idemclient.WithKey(req, key)
		return c.Do(req)
	})
}

func goRetryConstant(ctx context.Context, c *http.Client, body []byte) error {
	op := func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://x/orders", bytes.NewReader(body))
		req.Header.Set("Idempotency-Key", uuid.New().String()) // want "idempotency key created inside a retry loop"
		_, err := c.Do(req)
		return err
	}
	return goretry.Constant(ctx, time.Second, op)
}

// The key made once, before the retries; a request ID per attempt.
func backoffKeyOnce(c *http.Client, body []byte) error {
	key := uuid.NewString()
	return backoff.Retry(func() error {
		req, _ := http.NewRequest("POST", "http://x/orders", bytes.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("X-Request-Id", uuid.NewString())
		_, err := c.Do(req)
		return err
	}, backoff.NewExponentialBackOff())
}

func retryGoKeyOnce(c *idemclient.Client, body []byte) (*http.Response, error) {
	key, err := idemclient.NewKey()
	if err != nil {
		return nil, err
	}
	return retry.DoWithData(func() (*http.Response, error) {
		req, _ := http.NewRequest("POST", "http://x/orders", bytes.NewReader(body))
		req, _ = idemclient.WithKey(req, key)
		return c.Do(req)
	})
}

func goRetryKeyOnce(ctx context.Context, c *http.Client, body []byte) (*http.Response, error) {
	key := uuid.NewString()
	return goretry.DoValue(ctx, goretry.NewExponential(time.Second), func(ctx context.Context) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://x/orders", bytes.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("X-Request-Id", uuid.NewString())
		return c.Do(req)
	})
}

// An operation that sends nothing: nothing to report.
func backoffNoSend() (string, error) {
	return backoff.RetryWithData(func() (string, error) {
		return uuid.NewString(), nil
	}, backoff.NewExponentialBackOff())
}
