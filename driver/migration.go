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
	// CompatibleFrom says which binaries that predate this migration may
	// run against a schema that has it: those that know migration
	// CompatibleFrom or a later one (1: every binary; a migration that
	// only adds what they ignore, such as a table, a nullable column or
	// an index). Version, or 0, refuses every binary that does not know
	// this migration. The backends record it with the version when they
	// apply the migration, and a binary that finds a version it does not
	// know reads it there (see MigrationStatus.Err). The migration files
	// declare it (see LoadMigrations).
	CompatibleFrom int
}

// Marker describes CompatibleFrom as a migration file declares it:
// "refuse", "accept" or "accept from N".
func (m Migration) Marker() string { return marker(m.Version, m.CompatibleFrom) }

func marker(version, from int) string {
	switch {
	case from <= 0 || from >= version:
		return "refuse"
	case from == 1:
		return "accept"
	}
	return "accept from " + strconv.Itoa(from)
}

// olderBinaries is the comment line by which a migration file declares its
// CompatibleFrom.
const olderBinaries = "-- older binaries:"

// LoadMigrations reads the files NNN_name.sql of dir in fsys, ordered by
// version. Backends embed their migrations and call it.
//
// Every file declares, in its leading comment lines, whether binaries that
// predate it may run against a schema that has it (Migration's
// CompatibleFrom), with one of:
//
//	-- older binaries: refuse
//	-- older binaries: accept
//	-- older binaries: accept from N
//
// each optionally followed by a colon and the reason. accept: every older
// binary may (the migration only adds what they do not read or write, and
// what they write stays valid for this one); accept from N: those that
// know migration N or a later one; refuse: none. A file without the line,
// or with another value, is an error: a migration is never compatible by
// default.
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
		from, err := declaredCompatibleFrom(string(b), v)
		if err != nil {
			return nil, fmt.Errorf("idem/driver: migration %s: %w", e.Name(), err)
		}
		out = append(out, Migration{Version: v, Name: name, SQL: string(b), CompatibleFrom: from})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("idem/driver: duplicate migration version %d", out[i].Version)
		}
	}
	return out, nil
}

// declaredCompatibleFrom reads the "-- older binaries:" line of the
// leading comment lines of the SQL of migration version.
func declaredCompatibleFrom(sql string, version int) (int, error) {
	for line := range strings.Lines(sql) {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if !strings.HasPrefix(line, "--") {
			break
		}
		v, ok := strings.CutPrefix(line, olderBinaries)
		if !ok {
			continue
		}
		// What follows a colon is the reason, for the reader.
		v, _, _ = strings.Cut(v, ":")
		switch v = strings.TrimSpace(v); v {
		case "refuse":
			return version, nil
		case "accept":
			return 1, nil
		}
		if n, ok := strings.CutPrefix(v, "accept from "); ok {
			from, err := strconv.Atoi(strings.TrimSpace(n))
			if err != nil || from < 1 || from >= version {
				return 0, fmt.Errorf("%q: want accept from a version below %d", line, version)
			}
			return from, nil
		}
		return 0, fmt.Errorf("%q: want refuse, accept or accept from N", line)
	}
	return 0, fmt.Errorf("no %q line among the leading comments (refuse, accept or accept from N)", olderBinaries)
}

// MigrationStatus says which of a backend's migrations a database has.
type MigrationStatus struct {
	// Applied lists the versions recorded in idem_migration, ascending.
	// It may hold versions this binary does not know (a newer idem
	// migrated the database).
	Applied []int
	// CompatibleFrom holds the Migration.CompatibleFrom recorded with
	// each applied version that has one. A version without one (recorded
	// before idem recorded it, or by a tool that did not) refuses every
	// binary that does not know it.
	CompatibleFrom map[int]int
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

// Requires returns the oldest binary, by the highest migration it knows,
// that may run against the database: the highest of the applied versions'
// recorded CompatibleFrom, a version without one counting as itself.
func (s MigrationStatus) Requires() int {
	r := 0
	for _, v := range s.Applied {
		r = max(r, s.requires(v))
	}
	return r
}

func (s MigrationStatus) requires(v int) int {
	if f, ok := s.CompatibleFrom[v]; ok && f > 0 && f < v {
		return f
	}
	return v
}

// Marker describes what the database records for the applied version v,
// as Migration.Marker does: "refuse", "accept" or "accept from N".
func (s MigrationStatus) Marker(v int) string { return marker(v, s.CompatibleFrom[v]) }

// NewerAccepted reports whether the database has versions this binary does
// not know (a newer binary migrated it), every one of them recorded as
// accepting this binary, and nothing pending: Err returns nil, and the
// binary may run, but its operators should hear of it.
func (s MigrationStatus) NewerAccepted() bool {
	return len(s.Unknown()) > 0 && len(s.Pending) == 0 && s.Requires() <= s.Latest
}

// Err returns nil when the database has the migrations this binary knows,
// and no other or only newer ones recorded as accepting this binary (see
// NewerAccepted); else an error naming the pending versions or the unknown
// newer ones. Backends' Validate methods return it.
func (s MigrationStatus) Err() error {
	if u := s.Unknown(); len(u) > 0 {
		if r := s.Requires(); r > s.Latest {
			return fmt.Errorf("idem: database schema is newer than this binary: version %s (this binary knows up to %d), recorded as needing a binary that knows version %d or later",
				joinInts(u), s.Latest, r)
		}
		if len(s.Pending) > 0 {
			return fmt.Errorf("idem: database schema is newer than this binary: version %s (this binary knows up to %d), and lacks its migrations %s",
				joinInts(u), s.Latest, joinInts(versions(s.Pending)))
		}
		return nil
	}
	if len(s.Pending) > 0 {
		return fmt.Errorf("idem: database schema is behind: pending migrations %s (run Migrate, or idemd migrate up)", joinInts(versions(s.Pending)))
	}
	return nil
}

func versions(ms []Migration) []int {
	vs := make([]int, len(ms))
	for i, m := range ms {
		vs[i] = m.Version
	}
	return vs
}

// AppliedMigration is one row of a backend's migration table: an applied
// version and the Migration.CompatibleFrom recorded with it (0: none).
type AppliedMigration struct {
	Version        int
	CompatibleFrom int
}

// NewMigrationStatus compares the rows of a migration table, applied (in
// any order), with the known migrations ms (ordered by version), keeping
// what the rows record of CompatibleFrom.
func NewMigrationStatus(ms []Migration, applied []AppliedMigration) MigrationStatus {
	var s MigrationStatus
	done := make(map[int]bool, len(applied))
	for _, a := range applied {
		s.Applied = append(s.Applied, a.Version)
		done[a.Version] = true
		if a.CompatibleFrom > 0 {
			if s.CompatibleFrom == nil {
				s.CompatibleFrom = make(map[int]int)
			}
			s.CompatibleFrom[a.Version] = a.CompatibleFrom
		}
	}
	sort.Ints(s.Applied)
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
