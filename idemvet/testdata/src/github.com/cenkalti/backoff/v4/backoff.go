// Package backoff is a stub of cenkalti/backoff/v4 for the idemvet tests.
package backoff

import "time"

type BackOff interface {
	NextBackOff() time.Duration
	Reset()
}

type ExponentialBackOff struct{}

func (*ExponentialBackOff) NextBackOff() time.Duration { return 0 }
func (*ExponentialBackOff) Reset()                     {}

func NewExponentialBackOff() *ExponentialBackOff { return &ExponentialBackOff{} }

type Operation func() error

type OperationWithData[T any] func() (T, error)

type Notify func(error, time.Duration)

func Retry(o Operation, b BackOff) error                              { return o() }
func RetryNotify(operation Operation, b BackOff, notify Notify) error { return operation() }
func RetryWithData[T any](o OperationWithData[T], b BackOff) (T, error) {
	return o()
}
