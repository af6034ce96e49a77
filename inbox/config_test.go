package inbox_test

import (
	"strings"
	"testing"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testdb"
)

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	if _, err := inbox.New(drv, nil); err == nil {
		t.Error("New with a nil config succeeded; want an error (Consumer is required)")
	}
	if _, err := inbox.New[any](nil, &inbox.Config{Consumer: consumer}); err == nil {
		t.Error("New with a nil driver succeeded")
	}
	for _, name := range []string{
		"",
		" order-projection",
		"order-projection\n",
		"order\x00projection",
		"order\tprojection",
		"\xff\xfe",
		strings.Repeat("x", inbox.MaxConsumerLen+1),
	} {
		if _, err := inbox.New(drv, &inbox.Config{Consumer: name}); err == nil {
			t.Errorf("New with Consumer %q succeeded; want an error", name)
		}
	}
	for _, name := range []string{"order-projection", "billing.payments-v2", "Заказы", "a b", strings.Repeat("x", inbox.MaxConsumerLen)} {
		ib, err := inbox.New(drv, &inbox.Config{Consumer: name})
		if err != nil {
			t.Errorf("New with Consumer %q: %v", name, err)
			continue
		}
		if ib.Consumer() != name {
			t.Errorf("Consumer() = %q; want %q", ib.Consumer(), name)
		}
	}
}
