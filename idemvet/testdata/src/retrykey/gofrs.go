package retrykey

import (
	"net/http"

	gofrs "github.com/gofrs/uuid/v5"
)

// github.com/gofrs/uuid's constructors make a new UUID per call too.
func gofrsKeyInLoop(c *http.Client, req *http.Request) error {
	for {
		req.Header.Set("Idempotency-Key", gofrs.Must(gofrs.NewV4()).String()) // want "idempotency key created inside a retry loop"
		if _, err := c.Do(req); err == nil {
			return nil
		}
	}
}

// Not reported: a request ID beside a name-based key, the same on every
// attempt.
func gofrsDerivedKey(c *http.Client, req *http.Request, orderID string) error {
	for {
		req.Header.Set("X-Request-Id", gofrs.Must(gofrs.NewV7()).String())
		req.Header.Set("Idempotency-Key", gofrs.NewV5(gofrs.NamespaceOID, orderID).String())
		if _, err := c.Do(req); err == nil {
			return nil
		}
	}
}
