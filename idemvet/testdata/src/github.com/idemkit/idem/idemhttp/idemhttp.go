// Package idemhttp is a stub of idem's idemhttp for the idemvet tests.
package idemhttp

import "context"

const KeyHeader = "Idempotency-Key"

func TxFromContext[TTx any](ctx context.Context) (TTx, bool) {
	var tx TTx
	return tx, false
}
