package drivertest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
)

// DateStyleChecked checks a PostgreSQL driver on a single connection,
// migrated, under DateStyles other than ISO (set for a role or a database
// by ALTER ROLE ... SET DateStyle, as some European installations do).
// Timestamps then come as text in that style to a pool whose results are
// text (pgx's exec and simple_protocol query exec modes, the modes used
// behind PgBouncer): textResults. Such a pool cannot read them, so every
// claim fails; Validate must refuse it at start-up with an error naming the
// DateStyle and what to set. A pool with binary results reads them whatever
// the style: Validate accepts it, and a claimed record reads back with its
// expiry. exec runs a statement on
// that connection.
func DateStyleChecked[TTx any](t *testing.T, drv PostgresDriver[TTx], textResults bool, exec func(ctx context.Context, sql string) error) {
	t.Helper()
	ctx := t.Context()
	if err := drv.Validate(ctx); err != nil {
		t.Fatalf("Validate under DateStyle ISO: %v", err)
	}
	for i, style := range []string{"SQL, DMY", "German", "Postgres, MDY"} {
		if err := exec(ctx, `SET DateStyle = '`+style+`'`); err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		key := "datestyle-" + string(rune('a'+i))
		_, claimErr := drv.Executor().RecordClaim(ctx, &driver.RecordClaimParams{
			Scope: "s", Key: key, Fingerprint: []byte("f"), LeaseToken: "t",
			LeaseExpiresAt: now.Add(time.Minute), Now: now, ExpiresAt: now.Add(time.Hour),
		})
		if claimErr == nil {
			var rec *driver.Record
			rec, claimErr = drv.Executor().RecordGet(ctx, &driver.RecordGetParams{Scope: "s", Key: key})
			if claimErr == nil && !rec.ExpiresAt.Equal(now.Add(time.Hour).Truncate(time.Microsecond)) {
				t.Fatalf("under DateStyle %q: the record expires at %s, want %s", style, rec.ExpiresAt, now.Add(time.Hour))
			}
		}
		err := drv.Validate(ctx)
		if !textResults {
			if claimErr != nil || err != nil {
				t.Fatalf("binary results under DateStyle %q: claim: %v, Validate: %v; want both to work", style, claimErr, err)
			}
			continue
		}
		if claimErr == nil {
			t.Fatalf("claim under DateStyle %q with text results succeeded; the check below is moot", style)
		}
		if err == nil || !strings.Contains(err.Error(), `"`+style) || !strings.Contains(err.Error(), "datestyle=ISO") {
			t.Fatalf("Validate under DateStyle %q with text results: %v; want it refused, naming the DateStyle and datestyle=ISO (the claims fail: %v)", style, err, claimErr)
		}
	}
	if err := exec(ctx, `RESET DateStyle`); err != nil {
		t.Fatal(err)
	}
	if err := drv.Validate(ctx); err != nil {
		t.Fatalf("Validate under DateStyle ISO again: %v", err)
	}
}
