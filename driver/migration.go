package driver

import (
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// Migration is one numbered SQL migration of a backend. The SQL may contain
// the placeholders {{table}} (qualified table-name prefix) and {{name}}
// (bare prefix for index and constraint names), which the backend expands;
// the backends' Migrations methods return them rendered for their Config.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// LoadMigrations reads the files NNN_name.sql of dir in fsys, ordered by
// version. Backends embed their migrations and call it.
func LoadMigrations(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, e := range entries {
		base, ok := strings.CutSuffix(e.Name(), ".sql")
		if !ok {
			continue
		}
		num, name, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("idem/driver: bad migration file name %q", e.Name())
		}
		b, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: v, Name: name, SQL: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("idem/driver: duplicate migration version %d", out[i].Version)
		}
	}
	return out, nil
}

// MigrationStatus says which of a backend's migrations a database has.
type MigrationStatus struct {
	// Applied lists the versions recorded in idem_migration, ascending.
	// It may hold versions this binary does not know (a newer idem
	// migrated the database).
	Applied []int
	// Latest is the highest version this binary knows.
	Latest int
	// Pending lists the known migrations not applied, by version.
	Pending []Migration
}

// Current returns the highest applied version, 0 if none.
func (s MigrationStatus) Current() int {
	c := 0
	for _, v := range s.Applied {
		c = max(c, v)
	}
	return c
}

// UpToDate reports whether every known migration is applied.
func (s MigrationStatus) UpToDate() bool { return len(s.Pending) == 0 }

// Unknown returns the applied versions this binary does not know: those
// above Latest.
func (s MigrationStatus) Unknown() []int {
	var out []int
	for _, v := range s.Applied {
		if v > s.Latest {
			out = append(out, v)
		}
	}
	return out
}

// Err returns nil when the database has exactly the migrations this binary
// knows, else an error naming the pending versions or the unknown newer
// ones. Backends' Validate methods return it.
func (s MigrationStatus) Err() error {
	if u := s.Unknown(); len(u) > 0 {
		return fmt.Errorf("idem: database schema is newer than this binary: version %s (this binary knows up to %d)", joinInts(u), s.Latest)
	}
	if len(s.Pending) > 0 {
		vs := make([]int, len(s.Pending))
		for i, m := range s.Pending {
			vs[i] = m.Version
		}
		return fmt.Errorf("idem: database schema is behind: pending migrations %s (run Migrate, or idemd migrate up)", joinInts(vs))
	}
	return nil
}

// NewMigrationStatus compares the applied versions with the known
// migrations ms (ordered by version).
func NewMigrationStatus(ms []Migration, applied []int) MigrationStatus {
	sort.Ints(applied)
	s := MigrationStatus{Applied: applied}
	done := make(map[int]bool, len(applied))
	for _, v := range applied {
		done[v] = true
	}
	for _, m := range ms {
		s.Latest = max(s.Latest, m.Version)
		if !done[m.Version] {
			s.Pending = append(s.Pending, m)
		}
	}
	return s
}

func joinInts(vs []int) string {
	ss := make([]string, len(vs))
	for i, v := range vs {
		ss[i] = strconv.Itoa(v)
	}
	return strings.Join(ss, ", ")
}
