package idemkafka_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
)

// A production database refuses a consumer's writes for reasons that are
// no record's: a failover that leaves the pool on a hot standby or a DBA's
// default_transaction_read_only (25006), a GRANT revoked (42501), a role
// that may not log in any more (28000). The records are fine: none may be
// dead-lettered, and each is applied once the database takes writes again.

// appRole creates a login role that owns nothing but may use the tables
// and sequences of schema (an application role), dropped when the test
// ends, and returns its name.
func appRole(t *testing.T, admin *pgxpool.Pool, schema string) string {
	t.Helper()
	role := schema + "_app"
	for _, s := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT USAGE ON SCHEMA ` + schema + ` TO ` + role,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA ` + schema + ` TO ` + role,
		`GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA ` + schema + ` TO ` + role,
	} {
		if _, err := admin.Exec(context.Background(), s); err != nil {
			t.Fatal(s, err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = admin.Exec(ctx, `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE usename = $1`, role)
		_, _ = admin.Exec(ctx, `DROP OWNED BY `+role)
		_, _ = admin.Exec(ctx, `DROP ROLE IF EXISTS `+role)
	})
	return role
}

// roleConsumer starts a consumer of topic whose pool logs in as role, and
// returns it with its log.
func roleConsumer(t *testing.T, kc *kafkatest.Cluster, b *backend[pgx.Tx], schema, role, group, topic string,
	handler func(ctx context.Context, tx pgx.Tx, e event.Envelope) error) (*instance, *testlog.Buffer) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testdb.DSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	cfg.ConnConfig.User = role
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	logs := &testlog.Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	in, err := inbox.New[pgx.Tx](drv, &inbox.Config{Consumer: "billing", Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	ccfg := consumerConfig(kc, b, "billing", group, nil, topic)
	ccfg.Logger = logger
	if handler != nil {
		ccfg.Handler = handler
	}
	return startWith(t, drv, in, ccfg), logs
}

// terminateRole terminates the backends of role, as a failover or a
// restart does, and waits for them to exit.
func terminateRole(t *testing.T, admin *pgxpool.Pool, role string) {
	t.Helper()
	if _, err := admin.Exec(context.Background(), `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
		WHERE usename = $1 AND pid <> pg_backend_pid()`, role); err != nil {
		t.Fatal(err)
	}
}

// refusedFor runs the consumer's database refusal test: refuse makes the
// database refuse the role's writes, allow lets them through again; the
// consumer must fail on the refusal (a log line holding want) more than
// Retry.Attempts times while 16 events wait, and then apply each event
// once and dead-letter none.
func refusedFor(t *testing.T, want string, refuse, allow func(admin *pgxpool.Pool, role string),
	handler func(b *backend[pgx.Tx]) func(ctx context.Context, tx pgx.Tx, e event.Envelope) error) {
	testdb.RequirePostgres(t)
	_, schema := testdb.Schema(t, 1)
	b := postgresAt(t, schema, true)
	admin := testdb.Pool(t, schema, 1)
	role := appRole(t, admin, schema)
	kc := kafkatest.New(t)
	topic, group := consumedTopic(t, kc, 1)
	evs := newEvents(t, 16, 4)

	refuse(admin, role)
	var h func(ctx context.Context, tx pgx.Tx, e event.Envelope) error
	if handler != nil {
		h = handler(b)
	}
	inst, logs := roleConsumer(t, kc, b, schema, role, group, topic, h)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)
	// Retry.Attempts is 3: a record blamed for the refusal would be
	// dead-lettered by now. The refusal is logged once (its repeats are
	// summarised every 30 s), and counted in the batches' stats.
	waitFor(t, 60*time.Second, "the consumer failed on the refusal 8 times", func() bool {
		return strings.Contains(logs.String(), want) && inst.stats.get().failures >= 8
	})
	allow(admin, role)
	waitFor(t, 60*time.Second, "the partition committed to its end", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)
	s := inst.stats.get()
	t.Logf("stats: %d batches, %d applied, %d duplicates, %d failures, %d rewound, %d dead-lettered",
		s.batches, s.applied, s.duplicates, s.failures, s.rewound, s.dead)
	logWarnings(t, logs)
	if s.dead != 0 {
		t.Errorf("%d records dead-lettered; want none: the database refused the writes, not the records", s.dead)
	}
	if n := kc.EndOffsets(t, topic+idemkafka.DeadLetterSuffix)[0]; n != 0 {
		t.Errorf("dead-letter topic holds %d records; want 0", n)
	}
	mustOnce(t, b, "billing", evs)
}

func adminExec(t *testing.T, admin *pgxpool.Pool, q string) {
	t.Helper()
	if _, err := admin.Exec(context.Background(), q); err != nil {
		t.Fatal(q, err)
	}
}

// TestConsumerDatabaseReadOnly: the consumer's sessions are read-only
// (default_transaction_read_only, as on a hot standby the pool reached
// after a failover, or for a DBA's maintenance) while 16 events wait; then
// a failover to a writable primary (the role's setting reset, its
// sessions terminated).
func TestConsumerDatabaseReadOnly(t *testing.T) {
	t.Parallel()
	refusedFor(t, "read-only transaction",
		func(admin *pgxpool.Pool, role string) {
			adminExec(t, admin, `ALTER ROLE `+role+` SET default_transaction_read_only = on`)
		},
		func(admin *pgxpool.Pool, role string) {
			adminExec(t, admin, `ALTER ROLE `+role+` RESET default_transaction_read_only`)
			terminateRole(t, admin, role)
		}, nil)
}

// TestConsumerPrivilegeRevoked: the role may no longer insert into the
// handler's table (a GRANT revoked by a migration or a DBA) while 16
// events wait; then the GRANT is given back. The inbox's own statements
// succeed: the handler's fails with 42501, and every record was retried
// as at fault and dead-lettered.
func TestConsumerPrivilegeRevoked(t *testing.T) {
	t.Parallel()
	refusedFor(t, "permission denied",
		func(admin *pgxpool.Pool, role string) { adminExec(t, admin, `REVOKE INSERT ON effect FROM `+role) },
		func(admin *pgxpool.Pool, role string) { adminExec(t, admin, `GRANT INSERT ON effect TO `+role) }, nil)
}

// TestConsumerLoginRefused: the role may no longer log in (NOLOGIN, as a
// password rotation the consumer missed refuses it: 28000, 28P01) and its
// sessions are ended while 16 events wait; then it may again.
func TestConsumerLoginRefused(t *testing.T) {
	t.Parallel()
	refusedFor(t, "not permitted to log in",
		func(admin *pgxpool.Pool, role string) { adminExec(t, admin, `ALTER ROLE `+role+` NOLOGIN`) },
		func(admin *pgxpool.Pool, role string) { adminExec(t, admin, `ALTER ROLE `+role+` LOGIN`) }, nil)
}

// TestConsumerResourceLimit: the handler's query, after the inbox's and
// the handler's own writes, needs more temporary files than the server's
// temp_file_limit allows (53400 configuration_limit_exceeded, a resource
// of the server as a full disk, 53100, is) while 16 events wait; then an
// operator raises the limit (the role's setting reset, its sessions
// ended).
func TestConsumerResourceLimit(t *testing.T) {
	t.Parallel()
	refusedFor(t, "temp_file_limit",
		func(admin *pgxpool.Pool, role string) {
			adminExec(t, admin, `ALTER ROLE `+role+` SET temp_file_limit = '64kB'`)
			adminExec(t, admin, `ALTER ROLE `+role+` SET work_mem = '64kB'`)
		},
		func(admin *pgxpool.Pool, role string) {
			adminExec(t, admin, `ALTER ROLE `+role+` RESET temp_file_limit`)
			terminateRole(t, admin, role)
		},
		func(b *backend[pgx.Tx]) func(ctx context.Context, tx pgx.Tx, e event.Envelope) error {
			return func(ctx context.Context, tx pgx.Tx, e event.Envelope) error {
				if err := b.effect(ctx, tx, "billing", e); err != nil {
					return err
				}
				// A sort larger than work_mem: spilled to temporary files.
				_, err := tx.Exec(ctx, `SELECT count(*) FROM (SELECT g FROM generate_series(1, 100000) g ORDER BY g DESC OFFSET 0) s`)
				return err
			}
		})
}
