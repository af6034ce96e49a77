package app

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	ordpg "github.com/idemkit/idem/internal/orders/pgstore"
	ordsqlite "github.com/idemkit/idem/internal/orders/sqlitestore"
	"github.com/idemkit/idem/internal/payments/pgstore"
	"github.com/idemkit/idem/internal/payments/sqlitestore"
)

const migrateUsage = `usage: idemd migrate up|status|sql [-db DATABASE]

Manages the database schema, for deployments that migrate before starting
idemd (idemd also migrates at start).

  up      applies idem's migrations and idemd's own tables, and prints
          the migrations it applied
  status  prints idem's migrations, applied or pending, and idemd's own
          pending ones, each with whether binaries older than it may run
          against a schema that has it; exits 0 when the schema is up to
          date, 1 when migrations are pending (or the database has a
          newer version than this binary that does not accept it)
  sql     prints the SQL of idem's migrations for the database's kind
          (PostgreSQL or SQLite), for a DBA or a migration tool, each
          ending with the INSERT that records it in idem_migration

  -db DATABASE     as for idemd (IDEMD_DB, default ` + DefaultDB + `)
  -db-password-file FILE  as for idemd (IDEMD_DB_PASSWORD_FILE)
`

// migrator is what "idemd migrate" needs of a driver.
type migrator interface {
	Migrations() ([]driver.Migration, error)
	MigrationTableSQL() string
	MigrateApplied(ctx context.Context) ([]driver.Migration, error)
	MigrationStatus(ctx context.Context) (driver.MigrationStatus, error)
}

// runMigrate is "idemd migrate ...".
func runMigrate(ctx context.Context, args []string, getenv func(string) string, envErr error, stdout, stderr io.Writer) int {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		_, _ = fmt.Fprint(stdout, migrateUsage)
		return 0
	}
	if len(args) == 0 || (args[0] != "up" && args[0] != "status" && args[0] != "sql") {
		_, _ = fmt.Fprint(stderr, "idemd: unknown migrate command (want: idemd migrate up|status|sql)\n")
		return 2
	}
	cmd := args[0]
	name := "idemd migrate " + cmd
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dbDef := DefaultDB
	if v := getenv("IDEMD_DB"); v != "" {
		dbDef = v
	}
	db := dbFlags(fs, fs.String("db", dbDef, ""), getenv)
	err := fs.Parse(args[1:])
	if errors.Is(err, flag.ErrHelp) {
		_, _ = fmt.Fprint(stdout, migrateUsage)
		return 0
	}
	if envErr != nil {
		_, _ = fmt.Fprintf(stderr, "%s: %s\n", name, envErr)
		return 2
	}
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "%s: %v (run idemd migrate -h for help)\n", name, err)
		return 2
	}
	if fs.NArg() > 0 {
		_, _ = fmt.Fprintf(stderr, "%s: unexpected argument %q\n", name, fs.Arg(0))
		return 2
	}
	dbc, err := db(cmd != "sql") // sql connects to no database
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	}
	if cmd == "sql" {
		err = migrateSQL(dbc, stdout)
	} else {
		err = withMigrator(ctx, dbc, cmd == "up", func(m migrator, domain []domainTables) error {
			if cmd == "up" {
				return migrateUp(ctx, m, domain, stdout)
			}
			return migrateStatus(ctx, m, domain, stdout)
		})
	}
	switch {
	case errors.Is(err, errPending):
		return 1
	case err != nil:
		_, _ = fmt.Fprintf(stderr, "%s: database %s: %s\n", name, dbc, errMessage(err))
		return 1
	}
	return 0
}

// errPending is migrateStatus's answer for a schema that is not up to date,
// already printed.
var errPending = errors.New("schema not up to date")

// domainTables are idemd's own tables of one domain (payments, orders),
// migrated apart from idem's: their migrations are recorded in table. Those
// without a table (idemd_instance) have no status: up creates them, or
// the start does.
type domainTables struct {
	table   string
	migrate func(context.Context) error
	status  func(context.Context) (driver.MigrationStatus, error)
}

func migrateUp(ctx context.Context, m migrator, domain []domainTables, stdout io.Writer) error {
	done, err := m.MigrateApplied(ctx)
	for _, d := range done {
		_, _ = fmt.Fprintf(stdout, "applied %03d_%s\n", d.Version, d.Name)
	}
	if err != nil {
		return err
	}
	for _, d := range domain {
		if err := d.migrate(ctx); err != nil {
			return err
		}
	}
	if len(done) == 0 {
		_, _ = fmt.Fprint(stdout, "idem's migrations: up to date\n")
	}
	_, _ = fmt.Fprint(stdout, "idemd's tables: up to date\n")
	return nil
}

func migrateStatus(ctx context.Context, m migrator, domain []domainTables, stdout io.Writer) error {
	st, err := m.MigrationStatus(ctx)
	if err != nil {
		return err
	}
	ms, err := m.Migrations()
	if err != nil {
		return err
	}
	printStatus(stdout, "", ms, st)
	errs := []error{st.Err()}
	current := []string{fmt.Sprintf("version %d", st.Current())}
	var newer []string
	if st.NewerAccepted() {
		newer = append(newer, fmt.Sprintf("idem_migration %s", joinVersions(st.Unknown())))
	}
	for _, d := range domain {
		if d.status == nil {
			continue
		}
		ds, err := d.status(ctx)
		if err != nil {
			return err
		}
		printStatus(stdout, d.table+" ", ds.Pending, ds)
		if err := ds.Err(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", d.table, err))
		}
		current = append(current, fmt.Sprintf("%s %d", d.table, ds.Current()))
		if ds.NewerAccepted() {
			newer = append(newer, fmt.Sprintf("%s %s", d.table, joinVersions(ds.Unknown())))
		}
	}
	pending := false
	for _, err := range errs {
		if err != nil {
			_, _ = fmt.Fprintf(stdout, "%s\n", err)
			pending = true
		}
	}
	if pending {
		return errPending
	}
	_, _ = fmt.Fprintf(stdout, "up to date at %s\n", strings.Join(current, ", "))
	if len(newer) > 0 {
		_, _ = fmt.Fprintf(stdout, "newer than this binary, which its newer migrations accept: %s\n", strings.Join(newer, ", "))
	}
	return nil
}

// printStatus prints one line per migration of ms (applied or pending by
// st) and per applied version this binary does not know, each name
// prefixed with prefix, with whether binaries that predate it may run
// against a schema that has it: as ms declares it, and for the unknown
// versions as the database records it.
func printStatus(stdout io.Writer, prefix string, ms []driver.Migration, st driver.MigrationStatus) {
	pending := make(map[int]bool, len(st.Pending))
	for _, p := range st.Pending {
		pending[p.Version] = true
	}
	for _, x := range ms {
		state := "applied"
		if pending[x.Version] {
			state = "pending"
		}
		_, _ = fmt.Fprintf(stdout, "%03d %-28s %-36s %s\n", x.Version, prefix+x.Name, "older binaries: "+x.Marker(), state)
	}
	for _, v := range st.Unknown() {
		_, _ = fmt.Fprintf(stdout, "%03d %-28s %-36s applied, unknown to this binary\n", v, prefix+"?", "older binaries: "+st.Marker(v))
	}
}

// joinVersions formats versions as the status lines do.
func joinVersions(vs []int) string {
	ss := make([]string, len(vs))
	for i, v := range vs {
		ss[i] = fmt.Sprintf("%03d", v)
	}
	return strings.Join(ss, ", ")
}

// warnNewerSchema logs a WARN for each migration table (idem's, with drv's
// MigrationStatus, and those of statuses) that has versions this binary
// does not know, all recorded as accepting it: the start goes on (the
// migrate and Validate before it refused any other newer version), on a
// schema a newer release migrated.
func (a *App) warnNewerSchema(ctx context.Context, drv any, statuses []domainTables) {
	if m, ok := drv.(interface {
		MigrationStatus(context.Context) (driver.MigrationStatus, error)
	}); ok {
		statuses = append([]domainTables{{table: "idem_migration", status: m.MigrationStatus}}, statuses...)
	}
	for _, d := range statuses {
		st, err := d.status(ctx)
		if err != nil || !st.NewerAccepted() {
			continue
		}
		a.log.Warn("database schema is newer than this binary; its newer migrations accept this binary, which runs on it (a rolling deploy or a rollback)",
			"table", d.table, "versions", joinVersions(st.Unknown()), "known_up_to", st.Latest)
	}
}

// migrateSQL prints the SQL of idem's migrations for db's kind, without
// connecting to it.
func migrateSQL(db Database, stdout io.Writer) error {
	var m migrator
	if db.Kind == Postgres {
		pool, err := pgxpool.New(context.Background(), db.URL) // connects lazily: never here
		if err != nil {
			return err
		}
		defer pool.Close()
		if m, err = pgdriver.New(pool, nil); err != nil {
			return err
		}
	} else {
		sdb, err := sql.Open("sqlite", ":memory:") // the rendering does not depend on the file
		if err != nil {
			return err
		}
		defer func() { _ = sdb.Close() }()
		if m, err = sqlitedriver.New(sdb, nil); err != nil {
			return err
		}
	}
	ms, err := m.Migrations()
	if err != nil {
		return err
	}
	// Each section ends with the INSERT that records its version, as
	// Migrate does: the SQL applied as a whole, or a section at a time
	// by a migration tool, leaves a database idem sees migrated.
	// compatible_from is what the migration declares of older binaries
	// (driver.Migration's CompatibleFrom), which they read.
	record := "INSERT INTO idem_migration (version, name, compatible_from) VALUES (%d, '%s', %d);\n"
	if db.Kind != Postgres {
		record = "INSERT INTO idem_migration (version, name, applied_at, compatible_from) VALUES (%d, '%s', unixepoch('subsec') * 1000000, %d);\n"
	}
	_, _ = fmt.Fprintf(stdout, "-- idem_migration: the versions applied (each migration below ends with its INSERT)\n%s\n", m.MigrationTableSQL())
	for _, x := range ms {
		_, _ = fmt.Fprintf(stdout, "-- %03d_%s\n%s\n"+record+"\n", x.Version, x.Name, x.SQL, x.Version, strings.ReplaceAll(x.Name, "'", "''"), x.CompatibleFrom)
	}
	return nil
}

// withMigrator opens db and calls f with its driver and idemd's domain
// migrations. Unless create, a missing SQLite file is an error.
func withMigrator(ctx context.Context, db Database, create bool, f func(migrator, []domainTables) error) error {
	if db.Kind == Postgres {
		pcfg, err := db.poolConfig()
		if err != nil {
			return err
		}
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			return err
		}
		defer pool.Close()
		drv, err := pgdriver.New(pool, nil)
		if err != nil {
			return err
		}
		pay, ord := pgstore.New(pool), ordpg.New(pool)
		return f(drv, []domainTables{
			{table: "payment_migration", migrate: pay.Migrate, status: pay.MigrationStatus},
			{table: "order_migration", migrate: ord.Migrate, status: ord.MigrationStatus},
			// idemd_instance, which the embedded broker's log is matched
			// against: a role without CREATE rights can start idemd after
			// this.
			{migrate: func(ctx context.Context) error { _, err := postgresIdentity(ctx, pool); return err }},
		})
	}
	if !create {
		if _, err := os.Stat(db.Path); err != nil {
			return err
		}
		// status writes nothing: a file this process may only read
		// (which Open refuses) will do.
		sdb, err := sql.Open("sqlite", sqlitedriver.DSN(db.Path, 0))
		if err != nil {
			return err
		}
		defer func() { _ = sdb.Close() }()
		sdb.SetMaxOpenConns(1)
		drv, err := sqlitedriver.New(sdb, nil)
		if err != nil {
			return err
		}
		defer func() { _ = drv.Close() }()
		pay, ord := sqlitestore.New(sdb), ordsqlite.New(sdb)
		return f(drv, []domainTables{
			{table: "payment_migration", status: pay.MigrationStatus},
			{table: "order_migration", status: ord.MigrationStatus},
		})
	}
	drv, err := sqlitedriver.Open(db.Path, nil)
	if err != nil {
		return err
	}
	defer func() { _ = drv.Close() }()
	pay, ord := sqlitestore.New(drv.DB()), ordsqlite.New(drv.DB())
	return f(drv, []domainTables{
		{table: "payment_migration", migrate: pay.Migrate, status: pay.MigrationStatus},
		{table: "order_migration", migrate: ord.Migrate, status: ord.MigrationStatus},
		{migrate: func(ctx context.Context) error { _, err := sqliteInstance(ctx, drv.DB()); return err }},
	})
}
