// Package backoff is a stub of cenkalti/backoff/v5 for the idemvet tests.
package backoff

import "context"

type Operation[T any] func() (T, error)

type RetryOption func()

func Retry[T any](ctx context.Context, operation Operation[T], opts ...RetryOption) (T, error) {
	return operation()
}
