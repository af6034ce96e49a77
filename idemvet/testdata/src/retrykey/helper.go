package retrykey

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/idemkit/idem/idemclient"
)

// An API client's request helper that stamps every request with a new
// key, called on every attempt: each attempt is a new operation to the
// server.

type apiClient struct {
	http    *http.Client
	baseURL string
}

func (c *apiClient) newRequest(ctx context.Context, body []byte) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL+"/payments", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", uuid.NewString())
	return req, nil
}

func (c *apiClient) create(ctx context.Context, body []byte) (*http.Response, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		req, err := c.newRequest(ctx, body) // want `idempotency key created inside a retry loop \(by newRequest\)`
		if err != nil {
			return nil, err
		}
		resp, err := c.http.Do(req)
		if err == nil && resp.StatusCode < 500 {
			return resp, nil
		}
		lastErr = err
		time.Sleep(time.Duration(attempt) * time.Second)
	}
	return nil, fmt.Errorf("create payment: %w", lastErr)
}

func setHeaders(req *http.Request) {
	req.Header.Set("Accept", "application/json")
	key := uuid.New()
	req.Header.Set("Idempotency-Key", key.String())
}

func (c *apiClient) sign(req *http.Request) { setHeaders(req) }

func (c *apiClient) createSigned(ctx context.Context, body []byte) (*http.Response, error) {
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL, bytes.NewReader(body))
		c.sign(req) // want `idempotency key created inside a retry loop \(by sign\)`
		resp, err := c.http.Do(req)
		if err == nil {
			return resp, nil
		}
		time.Sleep(time.Second)
	}
}

func withNewKey(req *http.Request) *http.Request {
	key, _ := idemclient.NewKey()
	req, _ = idemclient.WithKey(req, key)
	return req
}

func createWithClient(c *idemclient.Client, req *http.Request) error {
	for {
		_, err := c.Do(withNewKey(req)) // want `idempotency key created inside a retry loop \(by withNewKey\)`
		if err == nil {
			return nil
		}
	}
}

// Not reported: the helper called once, before the loop; the loop sets
// the key itself (a stored one, over the helper's); the helper's key is a
// default for a request without one.

func (c *apiClient) createOnce(ctx context.Context, body []byte) (*http.Response, error) {
	req, err := c.newRequest(ctx, body)
	if err != nil {
		return nil, err
	}
	for {
		resp, err := c.http.Do(req)
		if err == nil {
			return resp, nil
		}
		time.Sleep(time.Second)
	}
}

func (c *apiClient) createStored(ctx context.Context, key string, body []byte) (*http.Response, error) {
	for {
		req, _ := c.newRequest(ctx, body)
		req.Header.Set("Idempotency-Key", key)
		resp, err := c.http.Do(req)
		if err == nil {
			return resp, nil
		}
		time.Sleep(time.Second)
	}
}

func (c *apiClient) do(req *http.Request) (*http.Response, error) {
	if req.Header.Get("Idempotency-Key") == "" {
		req.Header.Set("Idempotency-Key", uuid.NewString())
	}
	return c.http.Do(req)
}

func (c *apiClient) createDefault(ctx context.Context, key string, body []byte) (*http.Response, error) {
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL, bytes.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		resp, err := c.do(req)
		if err == nil {
			return resp, nil
		}
		time.Sleep(time.Second)
	}
}
