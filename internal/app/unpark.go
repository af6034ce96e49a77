package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/outbox"
)

const unparkUsage = `usage: idemd outbox unpark (-event ID1,ID2 | -key K1,K2 | -all) [-db DATABASE]

Makes parked outbox events eligible for publishing again, once the cause
of the park is fixed (see docs/operations.md, "A parked (poison) outbox
event"): the relay parks an event Kafka can never take (too large,
invalid), and holds the later events of its key behind it. Running relays
(idemd itself) publish each unparked event, then its key's held events, in
order. Events that are not parked (published, waiting, unknown) are left
as they are; an event still refused is parked again.

  -event ID1,ID2  the events of these IDs (event_id of the log line
                  "outbox: event parked as poison")
  -key K1,K2      the parked events of these keys (order IDs); with
                  -event, the events must match both
  -all            every parked event (parked before the command started)
  -db DATABASE    as for idemd (IDEMD_DB, default ` + DefaultDB + `)
  -db-password-file FILE  as for idemd (IDEMD_DB_PASSWORD_FILE)
`

// runUnpark is "idemd outbox unpark".
func runUnpark(ctx context.Context, args []string, getenv func(string) string, envErr error, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("idemd outbox unpark", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	db := outboxDBFlag(fs, getenv)
	events := fs.String("event", "", "")
	keys := fs.String("key", "", "")
	all := fs.Bool("all", false, "")
	err := fs.Parse(args[1:])
	if errors.Is(err, flag.ErrHelp) {
		_, _ = fmt.Fprint(stdout, unparkUsage)
		return 0
	}
	if envErr != nil {
		_, _ = fmt.Fprintf(stderr, "idemd outbox unpark: %s\n", envErr)
		return 2
	}
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "idemd outbox unpark: %v (run idemd outbox unpark -h for help)\n", err)
		return 2
	}
	opts := outbox.UnparkOptions{All: *all, Keys: splitList(*keys)}
	for _, s := range splitList(*events) {
		id, err := uuid.Parse(s)
		if err != nil {
			_, _ = fmt.Fprintf(stderr, "idemd outbox unpark: -event %q is not an event ID (a UUID)\n", s)
			return 2
		}
		opts.EventIDs = append(opts.EventIDs, id)
	}
	switch {
	case fs.NArg() > 0:
		_, _ = fmt.Fprintf(stderr, "idemd outbox unpark: unexpected argument %q\n", fs.Arg(0))
		return 2
	case opts.All && (len(opts.EventIDs) > 0 || len(opts.Keys) > 0):
		_, _ = fmt.Fprint(stderr, "idemd outbox unpark: -all unparks every parked event: give it without -event and -key\n")
		return 2
	case !opts.All && len(opts.EventIDs) == 0 && len(opts.Keys) == 0:
		_, _ = fmt.Fprint(stderr, "idemd outbox unpark: give -event ID1,ID2, -key K1,K2 or -all\n")
		return 2
	}
	dbc, err := db(true)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "idemd outbox unpark: %v\n", err)
		return 2
	}
	n, err := withOutbox(ctx, dbc,
		func(drv *pgdriver.Driver) (int, error) { return outbox.Unpark(ctx, drv, opts) },
		func(drv *sqlitedriver.Driver) (int, error) { return outbox.Unpark(ctx, drv, opts) })
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "idemd outbox unpark: database %s: %s\n", dbc, errMessage(err))
		return 1
	}
	what := "parked events (all of them)"
	if len(opts.EventIDs) > 0 {
		what = "of the " + strconv.Itoa(len(opts.EventIDs)) + " events given (" + strings.Join(splitList(*events), ",") + ")"
	}
	if len(opts.Keys) > 0 {
		if len(opts.EventIDs) > 0 {
			what += " of"
		} else {
			what = "parked events of"
		}
		what += " the keys " + strings.Join(opts.Keys, ",")
	}
	_, _ = fmt.Fprintf(stdout, "unparked %d %s; the running relays publish them, then the later events of their keys\n", n, what)
	return 0
}
