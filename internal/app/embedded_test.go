package app_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/outbox"
)

// start runs an app on dbArg with the embedded broker's log in dir until
// the returned stop is called; logs collects its log.
func start(t *testing.T, dbArg, dir string, count func(string) int, logs io.Writer) (*served, func()) {
	t.Helper()
	cfg, err := app.ParseConfig([]string{"-db", dbArg, "-cleanup", "off", "-kafka-dir", dir}, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.New(context.Background(), cfg, newTestLogger(logs))
	if err != nil {
		t.Fatalf("app.New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx, ln) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		a.Close()
	}
	t.Cleanup(stop)
	return &served{t: t, base: "http://" + ln.Addr().String(), count: count}, stop
}

// A new broker log (the directory deleted, or another -kafka-dir) loses the
// events the old one held: idemd republishes the whole outbox into it, and
// the inboxes drop what they had applied, so nothing is applied twice.
func TestEmbeddedNewLogRepublishes(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{app.Postgres, app.SQLite} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			dbArg, count := dbCounter(t, kind)
			s, stop := start(t, dbArg, t.TempDir(), count, io.Discard)
			for _, key := range []string{"a", "b", "c"} {
				if r := s.do(http.MethodPost, "/v1/orders", key, orderBody(3, "1.50")); r.status != http.StatusCreated {
					t.Fatalf("POST: %d %s", r.status, r.body)
				}
			}
			s.waitSummary(3, "orders=3 pending=0 confirmed=3 rejected=0 total_amount=4.5000")
			s.waitCount(unpublished(kind), 0)
			stop()
			events := count("outbox")
			applied := count(consumerEvents(app.ProjectionInbox))

			logs := &testlog.Buffer{}
			s, _ = start(t, dbArg, t.TempDir(), count, logs)
			republished := func() bool {
				return strings.Contains(logs.String(), "new log, every event still in the outbox is published again") &&
					strings.Contains(logs.String(), `"events":`+strconv.Itoa(events))
			}
			for deadline := time.Now().Add(10 * time.Second); !republished() && time.Now().Before(deadline); {
				time.Sleep(20 * time.Millisecond)
			}
			if !republished() {
				t.Errorf("no republication of the %d events logged:\n%s", events, logs)
			}
			s.waitCount(unpublished(kind), 0)
			// The projection saw every event again and applied none of them.
			s.waitCount(published(kind), events)
			s.waitSummary(3, "orders=3 pending=0 confirmed=3 rejected=0 total_amount=4.5000")
			if got := count(consumerEvents(app.ProjectionInbox)); got != applied {
				t.Errorf("projection inbox: %d events, want the %d of before", got, applied)
			}
			if n := count("payment"); n != 3 {
				t.Errorf("%d payments, want 3", n)
			}
		})
	}
}

// A broker log directory belongs to one database: another database refuses
// it at start (a ConfigError naming -kafka-dir).
func TestEmbeddedLogOfAnotherDatabase(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dbA, countA := dbCounter(t, app.SQLite)
	_, stop := start(t, dbA, dir, countA, io.Discard)
	waitMarker(t, dir)
	stop()
	for _, kind := range []string{app.SQLite, app.Postgres} {
		dbB, _ := dbCounter(t, kind)
		cfg, err := app.ParseConfig([]string{"-db", dbB, "-cleanup", "off", "-kafka-dir", dir}, envOf(nil))
		if err != nil {
			t.Fatal(err)
		}
		a, err := app.New(context.Background(), cfg, newTestLogger(io.Discard))
		if err == nil {
			a.Close()
			t.Fatalf("%s: app.New on another database's broker log succeeded", kind)
		}
		var ce *app.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), "another database") || !strings.Contains(err.Error(), "-kafka-dir") {
			t.Errorf("%s: %v; want a ConfigError about another database's log and -kafka-dir", kind, err)
		}
	}
}

// A database deleted and created again at the same place is another
// database: its broker log holds the old one's events (order IDs the new
// database hands out again) and consumer offsets past what the new one has
// published. idemd refuses it at start, saying to delete the log too; a
// log that moved with its database is still accepted.
func TestEmbeddedLogOfRecreatedDatabase(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{app.SQLite, app.Postgres} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			dbArg, count := dbCounter(t, kind)
			s, stop := start(t, dbArg, dir, count, io.Discard)
			if r := s.do(http.MethodPost, "/v1/orders", "k1", orderBody(1, "2.00")); r.status != http.StatusCreated {
				t.Fatalf("POST: %d %s", r.status, r.body)
			}
			s.waitCount(unpublished(kind), 0)
			stop()

			// The same database again: accepted.
			_, stop = start(t, dbArg, dir, count, io.Discard)
			stop()

			recreate(t, kind, dbArg)
			cfg, err := app.ParseConfig([]string{"-db", dbArg, "-cleanup", "off", "-kafka-dir", dir}, envOf(nil))
			if err != nil {
				t.Fatal(err)
			}
			a, err := app.New(context.Background(), cfg, newTestLogger(io.Discard))
			if err == nil {
				a.Close()
				t.Fatal("app.New on a recreated database with the old broker log succeeded")
			}
			var ce *app.ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), "created again") || !strings.Contains(err.Error(), "rm -r "+dir) {
				t.Errorf("%v; want a ConfigError saying the database was created again and to delete %s", err, dir)
			}
		})
	}
}

// recreate deletes the database of dbArg and leaves an empty one in its
// place: the SQLite file and its WAL, or every table of the schema.
func recreate(t *testing.T, kind, dbArg string) {
	t.Helper()
	if kind == app.SQLite {
		path := strings.TrimPrefix(dbArg, "sqlite:")
		for _, suffix := range []string{"", "-wal", "-shm"} {
			if err := os.Remove(path + suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
		}
		return
	}
	u, err := url.Parse(dbArg)
	if err != nil {
		t.Fatal(err)
	}
	schema := u.Query().Get("search_path")
	conn, err := pgx.Connect(context.Background(), testdb.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE; CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
}

// waitMarker waits until the broker log in dir is marked as its database's
// (after the outbox was republished into it, before the relay starts).
func waitMarker(t *testing.T, dir string) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(dir, "idemd-database")); err == nil {
			return
		}
	}
	t.Fatalf("broker log %s: no marker after 60s", dir)
}

// A -kafka that no broker answers (a typo, a cluster down) stops the start:
// idemd must not serve orders whose events nobody will take.
func TestUnreachableKafkaRefused(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nobody listens there now
	dbArg, _ := dbCounter(t, app.SQLite)
	// The database migrated first: on a loaded machine the migrations
	// alone may take the 3 s below, which must go to the retries of Kafka.
	migrated, err := app.ParseConfig([]string{"-db", dbArg, "-cleanup", "off", "-kafka", "off"}, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	if a, err := app.New(t.Context(), migrated, newTestLogger(io.Discard)); err != nil {
		t.Fatalf("migrate: %v", err)
	} else {
		a.Close()
	}
	cfg, err := app.ParseConfig([]string{"-db", dbArg, "-cleanup", "off", "-kafka", addr}, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	a, err := app.New(ctx, cfg, newTestLogger(io.Discard))
	if err == nil {
		a.Close()
		t.Fatalf("app.New with -kafka %s (nobody listening) succeeded", addr)
	}
	if !strings.Contains(err.Error(), "unreachable") || !strings.Contains(err.Error(), addr) {
		t.Errorf("error %q; want it to say kafka %s is unreachable", err, addr)
	}
}

// The embedded broker keeps a record less long than the inboxes remember it
// was applied (70 h < 72 h), not for ever: an event read again after its
// inbox row was swept (a consumer group reset, a lost offset) would be
// applied twice. Dead letters, never applied, are kept.
func TestEmbeddedRetention(t *testing.T) {
	t.Parallel()
	dbArg, count := dbCounter(t, app.SQLite)
	s, _ := start(t, dbArg, t.TempDir(), count, io.Discard)
	var k struct {
		Seeds []string `json:"seeds"`
		Topic string   `json:"topic"`
	}
	if err := json.Unmarshal(s.do(http.MethodGet, "/v1/kafka", "", "").body, &k); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rcs, err := kadm.NewClient(cl).DescribeTopicConfigs(t.Context(), k.Topic, k.Topic+".dlq")
	if err != nil {
		t.Fatal(err)
	}
	want := strconv.FormatInt(app.EmbeddedRetention.Milliseconds(), 10)
	for _, rc := range rcs {
		got := ""
		for _, c := range rc.Configs {
			if c.Key == "retention.ms" && c.Value != nil {
				got = *c.Value
			}
		}
		switch {
		case rc.Err != nil:
			t.Errorf("topic %s: %v", rc.Name, rc.Err)
		case rc.Name == k.Topic && got != want:
			t.Errorf("topic %s: retention.ms %q, want %s (70h)", rc.Name, got, want)
		case rc.Name != k.Topic && got == want:
			t.Errorf("dead-letter topic %s: retention.ms %s, want the broker's default (dead letters are evidence)", rc.Name, got)
		}
	}
	if len(rcs) != 2 {
		t.Errorf("%d topics described, want 2", len(rcs))
	}
}

// With a real cluster, idemd warns at start-up when the events' topic keeps
// events longer than the inboxes remember them (a group reset would apply
// them again), and says nothing when it does not.
func TestKafkaRetentionChecked(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.New(t)
	for _, c := range []struct {
		retention, segment string
		warn               bool
	}{
		{"604800000", "3600000", true},  // 7 days
		{"-1", "3600000", true},         // forever
		{"216000000", "3600000", false}, // 60 h + 1 h
		{"252000000", "", true},         // 70 h + the default segment of 7 days
	} {
		topic := kafkatest.Name("idemd-retention")
		cluster.CreateTopic(t, topic, 1)
		cluster.CreateTopic(t, topic+".dlq", 1) // idemd refuses to start without it
		set := []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "retention.ms", Value: &c.retention}}
		if c.segment != "" {
			set = append(set, kadm.AlterConfig{Op: kadm.SetConfig, Name: "segment.ms", Value: &c.segment})
		}
		res, err := cluster.Admin().AlterTopicConfigs(t.Context(), set, topic)
		if err == nil {
			err = res[0].Err
		}
		if err != nil {
			t.Fatalf("retention.ms=%s: %v", c.retention, err)
		}
		dbArg, _ := dbCounter(t, app.SQLite)
		cfg, err := app.ParseConfig([]string{"-db", dbArg, "-kafka", strings.Join(cluster.Seeds, ","), "-kafka-topic", topic}, envOf(nil))
		if err != nil {
			t.Fatal(err)
		}
		var logs testlog.Buffer
		a, err := app.New(t.Context(), cfg, newTestLogger(&logs))
		if err != nil {
			t.Fatalf("app.New: %v", err)
		}
		a.Close()
		if got := strings.Contains(logs.String(), "may keep events longer than the inboxes remember them"); got != c.warn {
			t.Errorf("retention.ms=%s segment.ms=%q: warned %v; want %v; logs:\n%s", c.retention, c.segment, got, c.warn, logs.String())
		}
	}
}

// With a real cluster, idemd refuses to start (a *ConfigError, exit 2)
// when the events' topic or its dead-letter topic (TOPIC.dlq) is missing,
// naming the missing ones and the fix, before it serves anything: on a
// cluster that does not create topics (and idemd never asks it to), the
// events would wait in the outbox, and the first record the consumers
// cannot apply would hold its partition, for as long as they are missing.
// With both, it starts without a warning about them.
func TestKafkaMissingTopicRefused(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.New(t)
	seeds := strings.Join(cluster.Seeds, ",")
	for _, tc := range []struct {
		name           string
		topic, dlq     bool
		missing, named []string // missing: the names the error must list
	}{
		{name: "both missing", missing: []string{"T", "T.dlq"}},
		{name: "dead-letter topic missing", topic: true, missing: []string{"T.dlq"}},
		{name: "topic missing", dlq: true, missing: []string{"T"}},
		{name: "both present", topic: true, dlq: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			topic := kafkatest.Name("idemd-topics")
			if tc.topic {
				cluster.CreateTopic(t, topic, 1)
			}
			if tc.dlq {
				cluster.CreateTopic(t, topic+".dlq", 1)
			}
			dbArg, _ := dbCounter(t, app.SQLite)
			cfg, err := app.ParseConfig([]string{"-db", dbArg, "-cleanup", "off", "-kafka", seeds, "-kafka-topic", topic}, envOf(nil))
			if err != nil {
				t.Fatal(err)
			}
			var logs testlog.Buffer
			a, err := app.New(t.Context(), cfg, newTestLogger(&logs))
			if len(tc.missing) == 0 {
				if err != nil {
					t.Fatalf("app.New with both topics: %v", err)
				}
				a.Close()
				if strings.Contains(logs.String(), "not usable") || strings.Contains(logs.String(), "do not have") {
					t.Errorf("both topics exist, yet idemd warned about them; logs:\n%s", logs.String())
				}
				return
			}
			if err == nil {
				a.Close()
				t.Fatalf("app.New succeeded; want it refused: %s missing", strings.Join(tc.missing, ", "))
			}
			var ce *app.ConfigError
			if !errors.As(err, &ce) {
				t.Errorf("error %v (%T); want a *app.ConfigError (exit 2)", err, err)
			}
			names := strings.ReplaceAll(strings.Join(tc.missing, ", "), "T", topic)
			for _, want := range []string{
				"kafka " + seeds + " does not have the topic",
				names + " (-kafka-topic " + topic + " and its dead-letter topic " + topic + ".dlq)",
				"create ",
				"idemd does not create topics",
			} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q; want it to contain %q", err, want)
				}
			}
			if !tc.topic && tc.dlq && strings.Contains(err.Error(), topic+".dlq,") {
				t.Errorf("error %q names the dead-letter topic, which exists", err)
			}
		})
	}
}

// idemd run on a cluster without the topic exits 2 with one line on
// stderr, and never says it is listening.
func TestKafkaMissingTopicExit(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.New(t)
	topic := kafkatest.Name("idemd-topics")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // an idemd that starts serves until then
	defer cancel()
	var stdout, stderr strings.Builder
	code := app.Run(ctx, []string{"-addr", "127.0.0.1:0", "-db", "sqlite:" + testdb.SQLitePath(t), "-cleanup", "off",
		"-kafka", strings.Join(cluster.Seeds, ","), "-kafka-topic", topic}, envOf(nil), &stdout, &stderr)
	if code != 2 || stdout.String() != "" {
		t.Errorf("exit %d, stdout %q; want exit 2 and nothing on stdout", code, stdout.String())
	}
	if e := stderr.String(); strings.Count(e, "\n") != 1 || !strings.HasPrefix(e, "idemd: kafka ") ||
		!strings.Contains(e, topic+", "+topic+".dlq") {
		t.Errorf("stderr %q; want one line naming %s and %s.dlq", e, topic, topic)
	}
}

// An idemd killed with SIGKILL leaves its SQLite relay lease behind. The
// next idemd on the database holds the embedded broker's lease, so no
// other idemd runs there: it must publish at once, not stand by until the
// dead relay's lease expires (here an hour away).
func TestEmbeddedTakesOverADeadRelayLease(t *testing.T) {
	t.Parallel()
	dbArg, count := dbCounter(t, app.SQLite)
	path := strings.TrimPrefix(dbArg, "sqlite:")
	drv, err := sqlitedriver.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ok, err := drv.Executor().LockAcquire(t.Context(), &driver.LockAcquireParams{
		Name: outbox.RelayLockName, Owner: "elsewhere/4242/dead", Now: now, Until: now.Add(time.Hour)})
	if err != nil || !ok {
		t.Fatalf("LockAcquire = %v, %v", ok, err)
	}
	_ = drv.Close()
	s := serveOn(t, dbArg, count)
	if r := s.do(http.MethodPost, "/v1/orders", "k-1", orderBody(3, "1")); r.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	s.waitSummary(3, "orders=1 pending=0 confirmed=1 rejected=0 total_amount=1.0000")
}
