// Package retry is a stub of sethvargo/go-retry for the idemvet tests.
package retry

import (
	"context"
	"time"
)

type Backoff interface {
	Next() (next time.Duration, stop bool)
}

type BackoffFunc func() (time.Duration, bool)

func (b BackoffFunc) Next() (time.Duration, bool) { return b() }

type RetryFunc func(ctx context.Context) error

type RetryFuncValue[T any] func(ctx context.Context) (T, error)

func NewExponential(base time.Duration) Backoff { return nil }

func WithMaxRetries(max uint64, next Backoff) Backoff { return next }

func Do(ctx context.Context, b Backoff, f RetryFunc) error { return f(ctx) }

func DoValue[T any](ctx context.Context, b Backoff, f RetryFuncValue[T]) (T, error) { return f(ctx) }

func Constant(ctx context.Context, t time.Duration, f RetryFunc) error { return f(ctx) }

func Exponential(ctx context.Context, base time.Duration, f RetryFunc) error { return f(ctx) }

func Fibonacci(ctx context.Context, base time.Duration, f RetryFunc) error { return f(ctx) }

func RetryableError(err error) error { return err }
