package saga_test

import (
	"testing"
	"time"

	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/saga"
)

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	if _, err := saga.New[any](nil, nil); err == nil {
		t.Error("New(nil driver) succeeded")
	}
	drv, err := sqlitedriver.Open(t.TempDir()+"/idem.db", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = drv.Close() })
	for _, cfg := range []saga.Config{
		{CompensationAttempts: -1},
		{CompensationBackoff: -time.Second},
		{CompensationBackoff: 5 * time.Minute}, // over the 30 s cap
	} {
		if _, err := saga.New(drv, &cfg); err == nil {
			t.Errorf("New(%+v) succeeded; want a validation error", cfg)
		}
	}
	if _, err := saga.New(drv, nil); err != nil {
		t.Errorf("New with the defaults: %v", err)
	}
}

func TestCompensationName(t *testing.T) {
	t.Parallel()
	if got := saga.CompensationName("reserve-stock"); got != "compensate:reserve-stock" {
		t.Errorf("CompensationName = %q", got)
	}
}
