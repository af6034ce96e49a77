// Package retry is a stub of avast/retry-go/v4 for the idemvet tests.
package retry

type RetryableFunc func() error

type RetryableFuncWithData[T any] func() (T, error)

type Option func()

func Attempts(n uint) Option { return func() {} }

func Do(retryableFunc RetryableFunc, opts ...Option) error { return retryableFunc() }

func DoWithData[T any](retryableFunc RetryableFuncWithData[T], opts ...Option) (T, error) {
	return retryableFunc()
}
