package idemkafka_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
)

// The crash tests run a consumer in a child process (this test binary,
// running TestCrashChild) that exits abruptly at a chosen point, as a
// killed pod would: no rollback, no offset commit, no LeaveGroup. A new
// consumer of the same group then takes over once the dead member's
// session expired.
const (
	envChild        = "IDEMKAFKA_TEST_CHILD" // the crash point
	envChildSeeds   = "IDEMKAFKA_TEST_CHILD_SEEDS"
	envChildTopic   = "IDEMKAFKA_TEST_CHILD_TOPIC"
	envChildGroup   = "IDEMKAFKA_TEST_CHILD_GROUP"
	envChildSession = "IDEMKAFKA_TEST_CHILD_SESSION"
	envChildCrashID = "IDEMKAFKA_TEST_CHILD_CRASH_ID"

	// crashAfterDBCommit: after the batch's transaction committed, before
	// its offsets are committed.
	crashAfterDBCommit = "after-db-commit"
	// crashBeforeDBCommit: inside the transaction, after the handler wrote
	// the effect of the event envChildCrashID.
	crashBeforeDBCommit = "before-db-commit"

	crashExit = 42
)

func TestCrashAfterDBCommitBeforeOffsetCommit(t *testing.T) {
	t.Parallel()
	forEachBackend(t, testCrash[pgx.Tx](crashAfterDBCommit), testCrash[*sql.Tx](crashAfterDBCommit))
}

func TestCrashBeforeDBCommit(t *testing.T) {
	t.Parallel()
	forEachBackend(t, testCrash[pgx.Tx](crashBeforeDBCommit), testCrash[*sql.Tx](crashBeforeDBCommit))
}

func testCrash[TTx any](mode string) func(t *testing.T, b *backend[TTx]) {
	return func(t *testing.T, b *backend[TTx]) {
		const n = 20
		kc := kafkatest.New(t)
		topic := kc.Topic(t, "orders", 1)
		group := kafkatest.Name("g")
		evs := newEvents(t, n, 4)
		kc.Produce(t, topic, recordsOf(topic, evs...)...)
		last := evs[n-1]

		crashChild(t, b, mode, kc, topic, group, last)

		// What the crash left behind.
		rows := b.rows(t, "billing")
		if got := b.processed(t, "billing"); got != len(rows) {
			t.Fatalf("after the crash: %d processed_event rows, %d effects; they must commit together", got, len(rows))
		}
		for id, k := range counts(rows) {
			if k != 1 {
				t.Fatalf("after the crash: event %s took effect %d times", id, k)
			}
		}
		committed := kc.Committed(t, group, topic)
		switch mode {
		case crashAfterDBCommit:
			if len(rows) == 0 || len(committed) != 0 {
				t.Fatalf("after a crash between the DB commit and the offset commit: %d effects, committed offsets %v; want effects and no offsets", len(rows), committed)
			}
		case crashBeforeDBCommit:
			if counts(rows)[last.ID] != 0 {
				t.Fatalf("the effect of the event being applied when the process died is committed")
			}
			if committed[0] != int64(len(rows)) {
				t.Fatalf("after a crash before the DB commit: %d effects, committed offset %d; want equal (only committed batches)", len(rows), committed[0])
			}
		}
		before := len(rows)

		// A new member of the group gets the records again.
		inst := start(t, b, "billing", consumerConfig(kc, b, "billing", group, nil, topic))
		waitFor(t, 30*time.Second, "the partition committed to its end", func() bool { return allCommitted(t, kc, group, topic) })
		mustStop(t, inst)

		mustOnce(t, b, "billing", evs)
		s := inst.stats.get()
		redelivered := before - int(committed[0])
		if s.duplicates != redelivered || s.applied != n-before {
			t.Fatalf("after the restart: applied %d, skipped %d duplicates; want %d and %d", s.applied, s.duplicates, n-before, redelivered)
		}
		t.Logf("%s: %d effects committed before the crash, %d redelivered and skipped, %d applied after", mode, before, s.duplicates, s.applied)
	}
}

// crashChild runs the child consumer and checks that it died at the crash
// point.
func crashChild[TTx any](t *testing.T, b *backend[TTx], mode string, kc *kafkatest.Cluster, topic, group string, crashAt event.Envelope) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), b.env...)
	cmd.Env = append(cmd.Env,
		envChild+"="+mode,
		envChildSeeds+"="+strings.Join(kc.Seeds, ","),
		envChildTopic+"="+topic,
		envChildGroup+"="+group,
		envChildSession+"="+kc.SessionTimeout().String(),
		envChildCrashID+"="+crashAt.ID.String(),
	)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != crashExit {
		t.Fatalf("child consumer: %v (want exit status %d)\n%s", err, crashExit, out)
	}
}

// TestCrashChild is the child process of the crash tests.
func TestCrashChild(t *testing.T) {
	mode := os.Getenv(envChild)
	if mode == "" {
		t.Skip("helper process of the crash tests")
	}
	target := os.Getenv(envTarget)
	switch os.Getenv(envBackend) {
	case "postgres":
		runChild(t, mode, postgresAt(t, target, false))
	case "sqlite":
		runChild(t, mode, sqliteAt(t, target, false))
	default:
		t.Fatalf("unknown %s", envBackend)
	}
}

func runChild[TTx any](t *testing.T, mode string, b *backend[TTx]) {
	session, err := time.ParseDuration(os.Getenv(envChildSession))
	if err != nil {
		t.Fatalf("%s: %v", envChildSession, err)
	}
	cfg := consumerConfigAt(strings.Split(os.Getenv(envChildSeeds), ","), b, "billing",
		os.Getenv(envChildGroup), nil, os.Getenv(envChildTopic))
	cfg.ExtraOpts = append(cfg.ExtraOpts, kgo.SessionTimeout(session), kgo.HeartbeatInterval(session/10))
	var setup []func(*idemkafka.Consumer[TTx])
	switch mode {
	case crashAfterDBCommit:
		setup = append(setup, func(c *idemkafka.Consumer[TTx]) {
			idemkafka.SetBeforeCommit(c, func([]*kgo.Record) { os.Exit(crashExit) })
		})
	case crashBeforeDBCommit:
		crashID := os.Getenv(envChildCrashID)
		apply := cfg.Handler
		cfg.Handler = func(ctx context.Context, tx TTx, e event.Envelope) error {
			if err := apply(ctx, tx, e); err != nil {
				return err
			}
			if e.ID.String() == crashID {
				os.Exit(crashExit) // the effect is written, the transaction open
			}
			return nil
		}
	default:
		t.Fatalf("unknown crash point %q", mode)
	}
	inst := start(t, b, "billing", cfg, setup...)
	select {
	case err := <-inst.done:
		t.Fatalf("Run returned %v before the crash point", err)
	case <-time.After(45 * time.Second):
		t.Fatal("the crash point was never reached")
	}
}
