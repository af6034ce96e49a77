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
// (bare prefix for index and constraint names), which the backend expands.
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
