package driver_test

import (
	"strings"
	"testing"
	"testing/fstest"

	"github.com/idemkit/idem/driver"
)

// Every migration declares what binaries that predate it may do: a file
// without the line, or with a value that means nothing, is refused, so a
// new migration cannot be written without deciding.
func TestLoadMigrationsDeclaredCompatibility(t *testing.T) {
	load := func(sql string) ([]driver.Migration, error) {
		return driver.LoadMigrations(fstest.MapFS{
			"m/001_first.sql":  {Data: []byte("-- older binaries: refuse\nCREATE TABLE a (id int);")},
			"m/007_second.sql": {Data: []byte(sql)},
		}, "m")
	}
	for _, tc := range []struct {
		sql    string
		from   int
		marker string
	}{
		{"-- older binaries: accept\nCREATE TABLE b (id int);", 1, "accept"},
		{"-- A new table.\n--\n-- older binaries: accept: it is new\n\nCREATE TABLE b (id int);", 1, "accept"},
		{"\n-- older binaries: refuse: it drops a column\nALTER TABLE a DROP COLUMN id;", 7, "refuse"},
		{"-- older binaries: accept from 5\nCREATE INDEX a_idx ON a (id);", 5, "accept from 5"},
	} {
		ms, err := load(tc.sql)
		if err != nil {
			t.Fatalf("%q: %v", tc.sql, err)
		}
		if m := ms[1]; m.CompatibleFrom != tc.from || m.Marker() != tc.marker || ms[0].CompatibleFrom != 1 || ms[0].Marker() != "refuse" {
			t.Errorf("%q: CompatibleFrom %d (%s); want %d (%s)", tc.sql, m.CompatibleFrom, m.Marker(), tc.from, tc.marker)
		}
	}
	for _, sql := range []string{
		"CREATE TABLE b (id int);",
		"-- A new table.\nCREATE TABLE b (id int);",
		"CREATE TABLE b (id int);\n-- older binaries: accept\n", // not among the leading comments
		"-- older binaries: yes\nCREATE TABLE b (id int);",
		"-- older binaries: accept from 7\nCREATE TABLE b (id int);", // not below its own version
		"-- older binaries: accept from 0\nCREATE TABLE b (id int);",
	} {
		if _, err := load(sql); err == nil || !strings.Contains(err.Error(), "007_second.sql") || !strings.Contains(err.Error(), "older binaries") {
			t.Errorf("%q: %v; want an error naming the file and the line it lacks", sql, err)
		}
	}
}

// What a binary knowing up to 8 makes of a database with newer versions.
func TestMigrationStatusNewer(t *testing.T) {
	var ms []driver.Migration
	for v := 1; v <= 8; v++ {
		ms = append(ms, driver.Migration{Version: v, CompatibleFrom: v})
	}
	all := func(extra ...driver.AppliedMigration) []driver.AppliedMigration {
		var a []driver.AppliedMigration
		for v := 1; v <= 8; v++ {
			a = append(a, driver.AppliedMigration{Version: v, CompatibleFrom: v})
		}
		return append(a, extra...)
	}
	for _, tc := range []struct {
		name    string
		applied []driver.AppliedMigration
		ok      bool
		want    string
	}{
		{"known only", all(), true, ""},
		{"accept", all(driver.AppliedMigration{Version: 9, CompatibleFrom: 1}), true, ""},
		{"accept from 8", all(driver.AppliedMigration{Version: 9, CompatibleFrom: 8}, driver.AppliedMigration{Version: 10, CompatibleFrom: 3}), true, ""},
		{"accept from 9", all(driver.AppliedMigration{Version: 10, CompatibleFrom: 9}), false, "version 10 (this binary knows up to 8), recorded as needing a binary that knows version 9 or later"},
		{"refuse", all(driver.AppliedMigration{Version: 9, CompatibleFrom: 1}, driver.AppliedMigration{Version: 10, CompatibleFrom: 10}), false, "version 9, 10 (this binary knows up to 8), recorded as needing a binary that knows version 10 or later"},
		{"none recorded", all(driver.AppliedMigration{Version: 9}), false, "version 9 (this binary knows up to 8), recorded as needing a binary that knows version 9 or later"},
		{"a gap", all(driver.AppliedMigration{Version: 9, CompatibleFrom: 1})[1:], false, "version 9 (this binary knows up to 8), and lacks its migrations 1"},
	} {
		st := driver.NewMigrationStatus(ms, tc.applied)
		err := st.Err()
		if tc.ok != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: Err() = %v; want ok %v, %q", tc.name, err, tc.ok, tc.want)
		}
		if got, want := st.NewerAccepted(), tc.ok && len(st.Unknown()) > 0; got != want {
			t.Errorf("%s: NewerAccepted() = %v; want %v", tc.name, got, want)
		}
	}
}
