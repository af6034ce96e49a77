package orders

import (
	"log/slog"
	"net/http"
	"testing"

	"github.com/idemkit/idem/internal/apijson/apijsontest"
)

// Create without a store and without the middleware: only the answers to
// bad requests, which come first, are reachable.
func TestCreateBadRequests(t *testing.T) {
	t.Parallel()
	apijsontest.Run(t, apijsontest.Endpoint{
		New: func(log *slog.Logger) http.HandlerFunc {
			return NewHandler[any](nil, nil, false, log).Create
		},
		Path:     "/v1/orders",
		MaxBytes: MaxRequestBytes,
		Secret:   `{"amount":"777.77","items":[{"sku":"secret`,
		Leaks:    []string{"777.77", "secret"},
	})
}
