package drivertest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/idemkit/idem/driver"
)

// MigrationTable is what NewerSchema needs to write a backend's migration
// table by hand, as a newer binary (or an older one) would have left it.
type MigrationTable[TTx any] struct {
	// New returns a driver on a fresh, empty database, and a function
	// that runs one statement on that database, with {{table}} replaced
	// by the migration table's name (with its schema and prefix, as the
	// driver names it). Required.
	New func(t *testing.T) (Migrator[TTx], func(query string) error)
	// CreateOld creates the migration table as idem created it before it
	// recorded compatible_from. Required.
	CreateOld string
	// InsertOld records a version in that table, as idem did then
	// ({{table}}, {{version}}, {{name}}). Required.
	InsertOld string
	// Insert records a version as idem does now ({{table}}, {{version}},
	// {{name}}, {{from}}: compatible_from, NULL for none). Required.
	Insert string
}

// Migrator is what NewerSchema needs of a driver.
type Migrator[TTx any] interface {
	driver.Driver[TTx]
	Migrations() ([]driver.Migration, error)
	MigrationStatus(ctx context.Context) (driver.MigrationStatus, error)
	Validate(ctx context.Context) error
}

// NewerSchema checks how a driver treats a database that a newer binary
// migrated (a rolling deploy's first new replica, a rollback of the
// binary): each version it does not know is accepted when the database
// records it as accepting this binary (compatible_from at most the highest
// version this binary knows), by Validate, Migrate and MigrateTx alike;
// refused otherwise (none recorded, a migration table from before
// compatible_from, or compatible_from above what this binary knows). It
// also checks the upgrade from a migration table created before
// compatible_from: Migrate adds the column and records what the
// migrations it applies declare.
func NewerSchema[TTx any](t *testing.T, mt MigrationTable[TTx]) {
	t.Helper()
	render := func(q string, version int, name string) string {
		return strings.NewReplacer("{{version}}", fmt.Sprint(version), "{{name}}", name).Replace(q)
	}
	must := func(t *testing.T, exec func(string) error, q string) {
		t.Helper()
		if err := exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// oldSchema returns a driver on a database migrated, all but the
	// migrations from skip on, as idem did before compatible_from.
	oldSchema := func(t *testing.T, skip int) (Migrator[TTx], func(string) error, []driver.Migration) {
		t.Helper()
		drv, exec := mt.New(t)
		ms, err := drv.Migrations()
		if err != nil {
			t.Fatal(err)
		}
		must(t, exec, render(mt.CreateOld, 0, ""))
		for _, m := range ms[:len(ms)-skip] {
			must(t, exec, m.SQL)
			must(t, exec, render(mt.InsertOld, m.Version, m.Name))
		}
		return drv, exec, ms
	}
	// newer records version as a newer binary does, with compatible_from
	// from ("NULL": none).
	newer := func(t *testing.T, exec func(string) error, version int, from string) {
		t.Helper()
		must(t, exec, strings.ReplaceAll(render(mt.Insert, version, "from_a_newer_binary"), "{{from}}", from))
	}
	accepted := func(t *testing.T, drv Migrator[TTx], want []int) {
		t.Helper()
		ctx := t.Context()
		if err := drv.Validate(ctx); err != nil {
			t.Fatalf("Validate: %v; want nil, the newer versions %v accept this binary", err, want)
		}
		st, err := drv.MigrationStatus(ctx)
		if err != nil || !st.NewerAccepted() || fmt.Sprint(st.Unknown()) != fmt.Sprint(want) || st.Err() != nil {
			t.Fatalf("MigrationStatus = %+v, %v; want NewerAccepted, Unknown %v, Err nil", st, err, want)
		}
		if err := drv.Migrate(ctx); err != nil {
			t.Fatalf("Migrate: %v; want nil (nothing to apply)", err)
		}
		tx, err := drv.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		err = drv.MigrateTx(ctx, tx)
		_ = drv.Rollback(ctx, tx)
		if err != nil {
			t.Fatalf("MigrateTx: %v; want nil", err)
		}
	}
	refused := func(t *testing.T, drv Migrator[TTx], want string) {
		t.Helper()
		ctx := t.Context()
		if err := drv.Validate(ctx); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Validate: %v; want an error containing %q", err, want)
		}
		if err := drv.Migrate(ctx); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Migrate: %v; want an error containing %q", err, want)
		}
		tx, err := drv.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		err = drv.MigrateTx(ctx, tx)
		_ = drv.Rollback(ctx, tx)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("MigrateTx: %v; want an error containing %q", err, want)
		}
		if st, err := drv.MigrationStatus(ctx); err != nil || st.NewerAccepted() || st.Err() == nil {
			t.Fatalf("MigrationStatus = %+v, %v; want the newer schema refused", st, err)
		}
	}
	migrated := func(t *testing.T) (Migrator[TTx], func(string) error, int) {
		t.Helper()
		drv, exec := mt.New(t)
		if err := drv.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
		st, err := drv.MigrationStatus(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return drv, exec, st.Latest
	}

	t.Run("Accepted", func(t *testing.T) {
		t.Parallel()
		drv, exec, latest := migrated(t)
		newer(t, exec, latest+1, "1")                  // accept
		newer(t, exec, latest+2, fmt.Sprint(latest))   // accept from this binary's latest
		newer(t, exec, latest+3, fmt.Sprint(latest-1)) // accept from an earlier one
		accepted(t, drv, []int{latest + 1, latest + 2, latest + 3})
	})
	t.Run("RefusedWithoutMarker", func(t *testing.T) {
		t.Parallel()
		drv, exec, latest := migrated(t)
		newer(t, exec, latest+1, "1")
		newer(t, exec, latest+2, "NULL") // recorded by a tool that set nothing
		refused(t, drv, fmt.Sprintf("newer than this binary: version %d, %d (this binary knows up to %d), recorded as needing a binary that knows version %d or later",
			latest+1, latest+2, latest, latest+2))
	})
	t.Run("RefusedByMarker", func(t *testing.T) {
		t.Parallel()
		drv, exec, latest := migrated(t)
		newer(t, exec, latest+1, fmt.Sprint(latest+1)) // refuse
		refused(t, drv, fmt.Sprintf("needing a binary that knows version %d or later", latest+1))
	})
	t.Run("RefusedAcceptFromLater", func(t *testing.T) {
		t.Parallel()
		drv, exec, latest := migrated(t)
		newer(t, exec, latest+1, "1")
		newer(t, exec, latest+2, fmt.Sprint(latest+1)) // accept from the newer one only
		refused(t, drv, fmt.Sprintf("needing a binary that knows version %d or later", latest+1))
	})
	t.Run("RefusedWithAGap", func(t *testing.T) {
		// The database lacks a migration this binary knows, below a newer
		// one that accepts it: not applied under the newer schema.
		t.Parallel()
		drv, exec, latest := migrated(t)
		must(t, exec, fmt.Sprintf("DELETE FROM {{table}} WHERE version = %d", latest))
		newer(t, exec, latest+1, "1")
		ctx := t.Context()
		want := fmt.Sprintf("and lacks its migrations %d", latest)
		if err := drv.Validate(ctx); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Validate: %v; want %q", err, want)
		}
		if err := drv.Migrate(ctx); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Migrate: %v; want %q", err, want)
		}
	})
	t.Run("OldTable", func(t *testing.T) {
		// A database migrated before compatible_from: this binary runs on
		// it as before, and a version it does not know is refused (there
		// is no marker to accept it by).
		t.Parallel()
		drv, exec, ms := oldSchema(t, 0)
		ctx := t.Context()
		if err := drv.Validate(ctx); err != nil {
			t.Fatalf("Validate on the schema as idem left it before compatible_from: %v", err)
		}
		if err := drv.Migrate(ctx); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
		st, err := drv.MigrationStatus(ctx)
		if err != nil || !st.UpToDate() || len(st.CompatibleFrom) != 0 {
			t.Fatalf("MigrationStatus = %+v, %v; want up to date, nothing recorded of compatible_from", st, err)
		}
		latest := ms[len(ms)-1].Version
		must(t, exec, render(mt.InsertOld, latest+1, "from_a_newer_binary"))
		refused(t, drv, fmt.Sprintf("needing a binary that knows version %d or later", latest+1))
	})
	t.Run("UpgradeOldTable", func(t *testing.T) {
		// Migrate on a table from before compatible_from, with a migration
		// pending: the column is added, the migration recorded with what
		// it declares; the versions recorded before have none.
		t.Parallel()
		drv, exec, ms := oldSchema(t, 1)
		ctx := t.Context()
		if err := drv.Migrate(ctx); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
		if err := drv.Validate(ctx); err != nil {
			t.Fatalf("Validate: %v", err)
		}
		st, err := drv.MigrationStatus(ctx)
		last := ms[len(ms)-1]
		if err != nil || !st.UpToDate() || st.Marker(last.Version) != last.Marker() || len(st.CompatibleFrom) != 1 {
			t.Fatalf("MigrationStatus = %+v, %v; want up to date, %d recorded as %q", st, err, last.Version, last.Marker())
		}
		// A newer binary's accepting version is accepted from then on.
		newer(t, exec, last.Version+1, "1")
		accepted(t, drv, []int{last.Version + 1})
	})
	t.Run("Recorded", func(t *testing.T) {
		// Migrate records what each migration declares.
		t.Parallel()
		drv, _, _ := migrated(t)
		ms, err := drv.Migrations()
		if err != nil {
			t.Fatal(err)
		}
		st, err := drv.MigrationStatus(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if got := st.Marker(m.Version); got != m.Marker() {
				t.Errorf("migration %d recorded as %q; it declares %q", m.Version, got, m.Marker())
			}
		}
	})
}
