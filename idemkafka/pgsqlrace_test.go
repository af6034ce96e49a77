package idemkafka_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testdb"
)

// isSQLCommit matches the simple-protocol COMMIT a *sql.Tx of pgx's stdlib
// sends.
func isSQLCommit(b []byte) bool {
	return len(b) > 0 && b[0] == 'Q' && bytes.Contains(bytes.ToLower(b), []byte("commit"))
}

// The rebalance race of TestRebalanceInFlight on database/sql
// (pgsqldriver): two members of one group, the second joining while the
// first applies a batch; every event takes effect once.
func TestRebalanceInFlightPostgresSQL(t *testing.T) {
	t.Parallel()
	testdb.RequirePostgres(t)
	testRebalanceInFlight(t, setupPostgresSQL(t))
}

// A consumer on pgsqldriver whose inbox COMMIT reaches PostgreSQL and
// commits, and whose answer is lost with the connection: the batch is
// retried as a database failure (never dead-lettered), and the retry finds
// its events processed: each takes effect once.
func TestCommitAnswerLostPostgresSQL(t *testing.T) {
	t.Parallel()
	b := setupPostgresSQL(t)
	kc := kafkatest.New(t)
	topic, group := consumedTopic(t, kc, 1)
	evs := newEvents(t, 20, 4)

	proxy := testdb.NewProxy(t)
	schema := strings.TrimPrefix(b.env[1], envTarget+"=")
	db := stdlib.OpenDB(*proxy.ConnConfig(t, schema))
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(4)
	drv, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	in, err := inbox.New(drv, &inbox.Config{Consumer: "billing", Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	fault := proxy.Arm(testdb.DropReply, isSQLCommit)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)
	inst := startWith(t, drv, in, consumerConfig(kc, b, "billing", group, nil, topic))
	select {
	case <-fault.Fired():
	case <-time.After(20 * time.Second):
		t.Fatal("no COMMIT went through the proxy")
	}
	waitFor(t, 20*time.Second, "committed", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)
	mustOnce(t, b, "billing", evs)
	s := inst.stats.get()
	t.Logf("applied %d, duplicates %d, dead-lettered %d, failures %d", s.applied, s.duplicates, s.dead, s.failures)
	if s.dead != 0 {
		t.Errorf("%d dead-lettered after a lost COMMIT answer; want 0", s.dead)
	}
	if s.duplicates == 0 {
		t.Errorf("no duplicate skipped: the fault did not hit a committed batch")
	}
}
