package pgsql

import (
	"context"
	"fmt"
	"strings"
	"time"
)

const (
	// DateStyleSQL reads the session's DateStyle: the format of the
	// timestamps the server sends as text.
	DateStyleSQL = `SELECT current_setting('DateStyle')`
	// TimeProbeSQL returns timeProbe as a timestamptz.
	TimeProbeSQL = `SELECT '2000-01-02 03:04:05.5+00'::timestamptz`
)

// timeProbe is what TimeProbeSQL returns.
var timeProbe = time.Date(2000, 1, 2, 3, 4, 5, 500_000_000, time.UTC)

// CheckDateStyle returns nil when the driver's pool reads the server's
// timestamps: when the session's DateStyle (read by style) is ISO,
// PostgreSQL's default, or when a timestamptz read by probe comes back
// right. Under another DateStyle (ALTER ROLE or ALTER DATABASE ... SET
// DateStyle = 'SQL, DMY', 'German', 'Postgres') a pool that gets its
// results as text (pgx's exec and simple_protocol query exec modes, those
// for PgBouncer before 1.21) cannot parse them, and every claim that reads
// a record fails; a pool with binary results is not affected. The error
// says what to change. driverName prefixes the errors.
func CheckDateStyle(ctx context.Context, driverName string, style func(context.Context) (string, error), probe func(context.Context) (time.Time, error)) error {
	s, err := style(ctx)
	if err != nil {
		return fmt.Errorf("%s: read the DateStyle: %w", driverName, err)
	}
	if strings.HasPrefix(strings.TrimSpace(s), "ISO") {
		return nil
	}
	got, err := probe(ctx)
	if err == nil && got.Equal(timeProbe) {
		return nil
	}
	if err == nil {
		err = fmt.Errorf("read %s back as %s", timeProbe.Format(time.RFC3339Nano), got.Format(time.RFC3339Nano))
	}
	return fmt.Errorf("%s: the session's DateStyle is %q, in which this pool cannot read PostgreSQL's timestamps "+
		"(its results come as text: pgx's exec or simple_protocol query exec mode), so idem cannot read its records back: "+
		"add datestyle=ISO to the connection URL (PgBouncer passes it on), or reset DateStyle for the role or database "+
		"the pool connects with: %w", driverName, s, err)
}
