package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/outbox"
)

const redriveUsage = `usage: idemd outbox redrive (-since DURATION | -all) [-key K1,K2] [-db DATABASE]

Publishes again the events that the outbox says were published, with their
original event IDs, for when the broker lost them: a topic deleted or
recreated, a cluster that failed over to a replica that lagged, an embedded
broker log removed. Running relays (idemd itself) publish them; consumers
with an inbox drop the ones they had applied. Events already removed by the
retention sweep cannot be redriven.

  -since DURATION  events published in the last DURATION (like 2h)
  -all             every event still in the outbox
  -key K1,K2       only the events of these keys (order IDs)
  -db DATABASE     as for idemd (IDEMD_DB, default ` + DefaultDB + `)
  -db-password-file FILE  as for idemd (IDEMD_DB_PASSWORD_FILE)
`

// runOutbox is "idemd outbox ...": the operator's outbox commands.
func runOutbox(ctx context.Context, args []string, getenv func(string) string, envErr error, stdout, stderr io.Writer) int {
	switch {
	case len(args) > 0 && args[0] == "redrive":
		return runRedrive(ctx, args, getenv, envErr, stdout, stderr)
	case len(args) > 0 && args[0] == "unpark":
		return runUnpark(ctx, args, getenv, envErr, stdout, stderr)
	}
	_, _ = fmt.Fprint(stderr, "idemd: unknown outbox command (want: idemd outbox redrive -since 2h, or idemd outbox unpark -event ID)\n")
	return 2
}

// outboxDBFlag returns the -db flag of an outbox command, defaulting to
// IDEMD_DB as for idemd.
func outboxDBFlag(fs *flag.FlagSet, getenv func(string) string) func(connect bool) (Database, error) {
	dbDef := DefaultDB
	if v := getenv("IDEMD_DB"); v != "" {
		dbDef = v
	}
	return dbFlags(fs, fs.String("db", dbDef, ""), getenv)
}

// dbFlags adds -db-password-file (IDEMD_DB_PASSWORD_FILE) to a
// subcommand's -db and returns the function that reads both once fs is
// parsed (the password file only for a command that connects).
func dbFlags(fs *flag.FlagSet, db *string, getenv func(string) string) func(connect bool) (Database, error) {
	pwFile := fs.String("db-password-file", getenv("IDEMD_DB_PASSWORD_FILE"), "")
	return func(connect bool) (Database, error) {
		d, err := ParseDatabase(*db)
		if err != nil {
			return Database{}, fmt.Errorf("-db: %w", err)
		}
		if f := strings.TrimSpace(*pwFile); f != "" && connect {
			if d, err = d.withPasswordFile(f); err != nil {
				return Database{}, fmt.Errorf("-db-password-file: %w", err)
			}
		}
		return d, nil
	}
}

// splitList returns the non-empty, trimmed elements of a comma-separated
// flag value.
func splitList(s string) []string {
	var out []string
	for k := range strings.SplitSeq(s, ",") {
		if k = strings.TrimSpace(k); k != "" {
			out = append(out, k)
		}
	}
	return out
}

// runRedrive is "idemd outbox redrive".
func runRedrive(ctx context.Context, args []string, getenv func(string) string, envErr error, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("idemd outbox redrive", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	db := outboxDBFlag(fs, getenv)
	sinceS := fs.String("since", "", "")
	all := fs.Bool("all", false, "")
	keys := fs.String("key", "", "")
	err := fs.Parse(args[1:])
	if errors.Is(err, flag.ErrHelp) {
		_, _ = fmt.Fprint(stdout, redriveUsage)
		return 0
	}
	if envErr != nil {
		_, _ = fmt.Fprintf(stderr, "idemd outbox redrive: %s\n", envErr)
		return 2
	}
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "idemd outbox redrive: %v (run idemd outbox redrive -h for help)\n", err)
		return 2
	}
	var opts outbox.RedriveOptions
	switch {
	case fs.NArg() > 0:
		_, _ = fmt.Fprintf(stderr, "idemd outbox redrive: unexpected argument %q\n", fs.Arg(0))
		return 2
	case *all == (*sinceS != ""):
		_, _ = fmt.Fprint(stderr, "idemd outbox redrive: give either -since DURATION (like 2h) or -all\n")
		return 2
	case *sinceS != "":
		d, err := time.ParseDuration(*sinceS)
		if err != nil || d <= 0 {
			_, _ = fmt.Fprintf(stderr, "idemd outbox redrive: -since %q is not a positive duration like 2h\n", *sinceS)
			return 2
		}
		opts.Since = time.Now().Add(-d)
	}
	opts.Keys = splitList(*keys)
	dbc, err := db(true)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "idemd outbox redrive: %v\n", err)
		return 2
	}
	n, err := redrive(ctx, dbc, opts)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "idemd outbox redrive: database %s: %s\n", dbc, errMessage(err))
		return 1
	}
	what := "published events (all of the outbox)"
	if !opts.Since.IsZero() {
		what = "events published since " + opts.Since.UTC().Format(time.RFC3339)
	}
	if len(opts.Keys) > 0 {
		what += " of the keys " + strings.Join(opts.Keys, ",")
	}
	_, _ = fmt.Fprintf(stdout, "redriven %d %s; the running relays publish them again\n", n, what)
	return 0
}

func redrive(ctx context.Context, db Database, opts outbox.RedriveOptions) (int, error) {
	return withOutbox(ctx, db,
		func(drv *pgdriver.Driver) (int, error) { return outbox.Redrive(ctx, drv, opts) },
		func(drv *sqlitedriver.Driver) (int, error) { return outbox.Redrive(ctx, drv, opts) })
}

// withOutbox opens the driver of db, an existing database (an outbox
// command never creates one), and runs pg or sqlite with it.
func withOutbox(ctx context.Context, db Database, pg func(*pgdriver.Driver) (int, error), sqlite func(*sqlitedriver.Driver) (int, error)) (int, error) {
	if db.Kind == Postgres {
		pcfg, err := db.poolConfig()
		if err != nil {
			return 0, err
		}
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			return 0, err
		}
		defer pool.Close()
		drv, err := pgdriver.New(pool, nil)
		if err != nil {
			return 0, err
		}
		return pg(drv)
	}
	if _, err := os.Stat(db.Path); err != nil {
		return 0, err
	}
	drv, err := sqlitedriver.Open(db.Path, nil)
	if err != nil {
		return 0, err
	}
	defer func() { _ = drv.Close() }()
	return sqlite(drv)
}
