package app_test

import (
	"context"
	"io"
	"sync"
	"testing"

	"github.com/idemkit/idem/internal/app"
)

// Replicas started together on a fresh PostgreSQL database (a Deployment's
// first rollout) all start: their migrations (idem's, the domains',
// the instance ID's) take turns instead of racing on CREATE TABLE, which
// PostgreSQL fails with a unique violation on pg_type's index.
func TestReplicasStartTogether(t *testing.T) {
	t.Parallel()
	for range 3 {
		dbArg, _ := dbSetting(t, app.Postgres)
		cfg, err := app.ParseConfig([]string{"-db", dbArg, "-kafka", "off"}, envOf(nil))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 4 {
			wg.Go(func() {
				<-start
				a, err := app.New(context.Background(), cfg, newTestLogger(io.Discard))
				if err != nil {
					t.Errorf("replica %d: %v", i, err)
					return
				}
				a.Close()
			})
		}
		close(start)
		wg.Wait()
	}
}
