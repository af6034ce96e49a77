package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// options are the command-line flags.
type options struct {
	dsn        string
	nA         int
	n          int
	batch      int
	workersA   int
	workers    int
	rounds     int
	dupFrac    float64
	accounts   int
	only       string
	syncCommit string
	cpuProfile string

	relayN        int
	relayKeys     int
	relayBatches  []int
	relays        int
	relayConc     int
	relayDelete   bool
	partitions    int
	enqueueBatch  int
	enqueueWriter int
	enqueueSlice  time.Duration
	relayTimeout  time.Duration

	latencyRate     float64
	latencyDuration time.Duration
	latencyWarmup   time.Duration
	latencyWriters  int

	restartN       int
	restartSession time.Duration
	child          childOpts // the hidden flags of a child process (restart)
}

func main() {
	var o options
	var relayBatches string
	flag.StringVar(&o.dsn, "dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL URL; a private schema is created there and dropped at exit")
	flag.IntVar(&o.nA, "na", 10_000, "events per round in scenario a (one transaction per event: slow)")
	flag.IntVar(&o.n, "n", 50_000, "events per round in the batched scenarios (b, c, b2, c2)")
	flag.IntVar(&o.batch, "batch", 500, "events per batch in the batched scenarios (a Kafka poll: idemkafka's default MaxPollRecords)")
	flag.IntVar(&o.workersA, "workers-a", 8, "concurrent workers (connections) in scenario a")
	flag.IntVar(&o.workers, "workers", 4, "concurrent workers (connections; think partitions consumed at once) in the batched scenarios")
	flag.IntVar(&o.rounds, "rounds", 3, "rounds; every scenario runs once per round, in a random order; figures are medians over rounds")
	flag.Float64Var(&o.dupFrac, "dup", 0.10, "after each timed run, redeliver this fraction of its events (the duplicate round; 0 skips it)")
	flag.IntVar(&o.accounts, "accounts", 1000, "distinct account keys the consumed events carry")
	flag.StringVar(&o.only, "scenarios", "a,b,c,b2,c2,relay", "scenarios to run, comma-separated (a, b and c are needed for the targets; enqueue, latency and restart are not in the default)")
	flag.StringVar(&o.syncCommit, "synchronous-commit", "", "synchronous_commit for the bench's sessions (default: the server's)")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file")

	flag.IntVar(&o.relayN, "relay-n", 100_000, "relay: outbox rows written, then published")
	flag.IntVar(&o.relayKeys, "relay-keys", 1000, "relay: distinct record keys (aggregates)")
	flag.StringVar(&relayBatches, "relay-batch", "500", "relay: RelayConfig.BatchSize, a comma list to try several (each on a fresh outbox and topic); 0 is the library default")
	flag.IntVar(&o.relays, "relays", 1, "relay: concurrent Relay instances (replicas) sharing the outbox")
	flag.IntVar(&o.relayConc, "relay-concurrency", 0, "relay: RelayConfig.Concurrency of each relay (batches in flight; 0 is the library default)")
	flag.BoolVar(&o.relayDelete, "relay-delete-published", false, "relay: pgdriver.Config.OutboxDeletePublished (delete rows once published instead of marking them)")
	flag.IntVar(&o.partitions, "partitions", 6, "relay: partitions of the kfake topic")
	flag.IntVar(&o.enqueueBatch, "enqueue-batch", 500, "relay: events per enqueuing transaction (outbox.EnqueueTx)")
	flag.IntVar(&o.enqueueWriter, "enqueue-writers", 2, "relay: concurrent enqueuing transactions (each owns a share of the keys); enqueue: writers (connections)")
	flag.DurationVar(&o.enqueueSlice, "enqueue-slice", 3*time.Second, "enqueue: length of each turn of a driver per round")
	flag.DurationVar(&o.relayTimeout, "relay-timeout", 5*time.Minute, "relay: give up waiting for the outbox to drain after this long")

	flag.Float64Var(&o.latencyRate, "latency-rate", 1000, "latency: events/s enqueued, one transaction per event (also uses -relay-keys, -relays, -partitions)")
	flag.DurationVar(&o.latencyDuration, "latency-duration", 20*time.Second, "latency: measured window, after the warm-up")
	flag.DurationVar(&o.latencyWarmup, "latency-warmup", 2*time.Second, "latency: load before the window, not counted")
	flag.IntVar(&o.latencyWriters, "latency-writers", 8, "latency: writer goroutines (connections) sharing -latency-rate, each pacing on a ticker")

	flag.IntVar(&o.restartN, "restart-n", 50_000, "restart: events relayed, then consumed, in each run (also uses -relay-keys, -partitions, -relay-concurrency)")
	flag.DurationVar(&o.restartSession, "restart-session", 6*time.Second, "restart: the consumer group's session timeout (6s is the least a Kafka broker accepts by default)")

	// The hidden flags of a child process of the restart scenario (this
	// program re-executed): not shown by -h.
	flag.StringVar(&o.child.role, "child", "", "")
	flag.StringVar(&o.child.schema, "child-schema", "", "")
	flag.StringVar(&o.child.seeds, "child-seeds", "", "")
	flag.StringVar(&o.child.topic, "child-topic", "", "")
	flag.StringVar(&o.child.name, "child-name", "", "")
	flag.StringVar(&o.child.instance, "child-instance", "", "")
	flag.Usage = usage
	flag.Parse()

	for s := range strings.SplitSeq(relayBatches, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || v < 0 {
			fmt.Fprintf(os.Stderr, "kafkabench: -relay-batch: %q is not a batch size\n", s)
			os.Exit(2)
		}
		o.relayBatches = append(o.relayBatches, v)
	}
	if o.nA < 1 || o.n < 1 || o.batch < 1 || o.workersA < 1 || o.workers < 1 || o.rounds < 1 ||
		o.dupFrac < 0 || o.dupFrac > 1 || o.accounts < 1 || o.relayN < 1 || o.relayKeys < 1 ||
		o.relays < 1 || o.partitions < 1 || o.enqueueBatch < 1 || o.enqueueWriter < 1 || o.enqueueSlice <= 0 || o.relayTimeout <= 0 {
		fmt.Fprintln(os.Stderr, "kafkabench: sizes, counts and -relay-timeout must be positive; -dup must be within [0, 1]")
		os.Exit(2)
	}
	if o.latencyRate <= 0 || o.latencyDuration <= 0 || o.latencyWarmup < 0 || o.latencyWriters < 1 {
		fmt.Fprintln(os.Stderr, "kafkabench: -latency-rate, -latency-duration and -latency-writers must be positive, -latency-warmup not negative")
		os.Exit(2)
	}
	if o.restartN < 2 || o.restartSession <= 0 {
		fmt.Fprintln(os.Stderr, "kafkabench: -restart-n must be at least 2 and -restart-session positive")
		os.Exit(2)
	}

	if o.child.role != "" {
		// A child process of the restart scenario: SIGTERM stops it
		// gracefully, SIGKILL is the crash.
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if err := runChild(ctx, o); err != nil {
			fmt.Fprintf(os.Stderr, "kafkabench: child %s: %v\n", o.child.role, err)
			os.Exit(1)
		}
		return
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "kafkabench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) (err error) {
	want := map[string]bool{}
	for s := range strings.SplitSeq(o.only, ",") {
		if s = strings.TrimSpace(s); s != "" {
			want[s] = true
		}
	}
	runID := randHex(4)
	schema := "kafkabench_" + runID

	admin, err := pgx.Connect(ctx, o.dsn)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() { _ = admin.Close(context.Background()) }()
	if err := createSchema(ctx, admin, schema); err != nil {
		return err
	}
	defer func() {
		_, derr := admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		err = errors.Join(err, derr)
	}()

	env := &bench{o: o, admin: admin, schema: schema, runID: runID}
	if err := env.migrate(ctx); err != nil {
		return err
	}
	cond, err := env.conditions(ctx)
	if err != nil {
		return err
	}
	fmt.Println("kafkabench: per-event transactions vs idem's batched inbox vs the same batch without dedup; outbox relay PostgreSQL -> kfake")
	fmt.Println(cond)
	fmt.Println()

	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	scs := env.scenarios(want)
	if len(scs) > 0 {
		if err := env.runConsumers(ctx, scs); err != nil {
			return err
		}
	}
	if want["relay"] {
		for _, bs := range o.relayBatches {
			fmt.Println()
			if err := env.runRelay(ctx, bs); err != nil {
				return err
			}
		}
	}
	if want["enqueue"] {
		fmt.Println()
		if err := env.runEnqueue(ctx); err != nil {
			return err
		}
	}
	if want["latency"] {
		fmt.Println()
		if err := env.runLatency(ctx); err != nil {
			return err
		}
	}
	if want["restart"] {
		fmt.Println()
		if err := env.runRestart(ctx); err != nil {
			return err
		}
	}
	fmt.Printf("\nload average at end %s (GOMAXPROCS=%d)\n", loadAvg(), runtime.GOMAXPROCS(0))
	return nil
}

// usage prints the flags but the hidden ones of a child process.
func usage() {
	out := flag.CommandLine.Output()
	_, _ = fmt.Fprintf(out, "Usage of %s:\n", os.Args[0])
	shown := flag.NewFlagSet(os.Args[0], flag.ContinueOnError)
	shown.SetOutput(out)
	flag.VisitAll(func(f *flag.Flag) {
		if f.Name != "child" && !strings.HasPrefix(f.Name, "child-") {
			shown.Var(f.Value, f.Name, f.Usage)
			shown.Lookup(f.Name).DefValue = f.DefValue
		}
	})
	shown.PrintDefaults()
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// loadAvg returns the 1, 5 and 15 minute load averages, or "n/a".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "n/a"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "n/a"
	}
	return strings.Join(f[:3], " ")
}
