package app

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shopspring/decimal"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/internal/orders"
	"github.com/idemkit/idem/internal/payments"
	"github.com/idemkit/idem/problem"
)

const demoUsage = `usage: idemd demo [-url URL] [-kafka HOST:PORT] [-orders N] [-seed N] [flags]

Drives a running idemd the way real clients and brokers misbehave, then
prints a table proving, through its HTTP API and Kafka only, that nothing
took effect twice and nothing was lost:

  1. creates N orders with idemclient (one Idempotency-Key per order);
     some responses are lost after idemd executed the request (the client
     retries with the same key), and some orders are sent by 5 clients at
     once with the same key
  2. pays some orders (POST /v1/payments) the same way, and sends some
     payments again under a NEW key: the UNIQUE (provider, external id)
     must answer with the existing payment
  3. reads the run's order events back from Kafka and produces every
     record again 2 or 3 times (same partition, key, value and headers):
     the consumers' inboxes must drop them
  4. waits for the sagas and the projection to settle, and reads what
     idemd holds: orders, payments, sagas' charges, customer summaries;
     every amount must be the one sent, and the sums must agree (orders
     to confirm = saga charges = summaries' total_amount)

An operation answered 503 store-unavailable ("the command was not
executed") on every attempt, idemd's database being down for longer than
the retries, is counted as refused, not lost; one that was executed all
the same shows up as a double effect. It exits 0 when there are no double
effects and nothing is lost (and not every order was refused), 1
otherwise, 2 for bad flags.

  -url URL          idemd's base URL (default http://IDEMD_ADDR, else
                    http://` + DefaultAddr + `)
  -kafka HOST:PORT  idemd's Kafka seed brokers, for step 3 (default
                    IDEMD_KAFKA when it lists brokers, else
                    IDEMD_KAFKA_EMBEDDED_ADDR when its port is fixed,
                    else what idemd tells at GET /v1/kafka, its
                    embedded broker's address included)
  -kafka-tls, -kafka-tls-ca, -kafka-tls-cert, -kafka-tls-key,
  -kafka-tls-server-name, -kafka-sasl, -kafka-sasl-user,
  -kafka-sasl-password-file
                    TLS and SASL of step 3's Kafka client, as for idemd
                    and with the same environment variables (the password
                    from IDEMD_KAFKA_SASL_PASSWORD or the file): the
                    environment of an idemd on a secured cluster serves
                    its demo as it is
  -reproduce=false  skip step 3 (the table says so)
  -topic TOPIC      the order events' topic (IDEMD_KAFKA_TOPIC, default
                    ` + DefaultKafkaTopic + `)
  -orders N         orders to create (default 50)
  -seed N           seed of the faults and amounts (default: random,
                    printed)
  -token TOKEN      bearer token of the requests (default: anonymous)
  -concurrency N    operations in flight (default 8)
  -attempts N       attempts of each request, with idemclient's backoff
                    of at most 2 s between two (default 10: about 10 s
                    of an unavailable database ridden out)
  -timeout D        how long to wait for idemd to settle (default 2m)
`

// Parameters of idemd demo.
const (
	// DefaultDemoOrders is the default -orders.
	DefaultDemoOrders = 50
	// DefaultDemoAttempts is the default -attempts: with waits of at most
	// demoMaxDelay (idemd's Retry-After: 1 s), an operation rides out about
	// 10 s of a database that is down.
	DefaultDemoAttempts = 10
	// demoMaxDelay bounds idemclient's own backoff between two attempts of
	// a request (a server's Retry-After is waited for in full).
	demoMaxDelay = 2 * time.Second
	// demoDuplicates is how many clients send a duplicated operation at
	// once, with one key.
	demoDuplicates = 5
	// demoProvider is the payment provider of the payments demo sends.
	demoProvider = "demo-psp"
	// demoScanSlack is how many ids in a row past the run's lowest and
	// highest ids must hold nothing of the run for a scan to stop.
	demoScanSlack = 16
	// demoQuiet is how long the summaries must stay unchanged, once the
	// consumers read past everything, to count as settled when they do
	// not match.
	demoQuiet = 3 * time.Second
)

// errLostResponse is the error demoTransport returns instead of a response
// it read and threw away.
var errLostResponse = errors.New("demo: response lost on purpose after the server answered")

// demoConfig is the configuration of idemd demo.
type demoConfig struct {
	url, kafka, topic, token string
	// shownURL is url for messages: its password (user info) hidden.
	shownURL string
	// auth is how step 3 connects to Kafka: idemd's TLS and SASL
	// settings, with the same flags and environment variables.
	auth                KafkaAuth
	orders, concurrency int
	// attempts is idemclient's MaxAttempts for each request.
	attempts int
	seed     uint64
	timeout  time.Duration
	// reproduce: step 3 runs (with -kafka, or the brokers idemd tells).
	reproduce bool
	// topicSet: -topic (or IDEMD_KAFKA_TOPIC) was given.
	topicSet bool
}

// runDemo is "idemd demo".
func runDemo(ctx context.Context, args []string, getenv func(string) string, envErr error, stdout, stderr io.Writer) int {
	cfg, err := parseDemo(args, getenv)
	if errors.Is(err, flag.ErrHelp) {
		_, _ = fmt.Fprint(stdout, demoUsage)
		return 0
	}
	if envErr != nil {
		_, _ = fmt.Fprintf(stderr, "idemd demo: %s\n", envErr)
		return 2
	}
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "idemd demo: %s (run idemd demo -h for help)\n", errMessage(err))
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	d, err := newDemo(cfg, log)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "idemd demo: %s\n", errMessage(err))
		return 1
	}
	rep, err := d.run(ctx)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "idemd demo: %s\n", errMessage(err))
		return 1
	}
	rep.print(stdout)
	if !rep.ok() {
		return 1
	}
	return 0
}

// parseDemo reads the flags of idemd demo, with defaults from idemd's
// environment variables.
func parseDemo(args []string, getenv func(string) string) (demoConfig, error) {
	fs := flag.NewFlagSet("idemd demo", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	urlDef := "http://" + DefaultAddr
	if a := demoAddr(getenv("IDEMD_ADDR")); a != "" {
		urlDef = "http://" + a
	}
	kafkaDef := ""
	if k, err := ParseKafka(getenv("IDEMD_KAFKA")); err == nil && k.Mode == KafkaBrokers {
		kafkaDef = k.Brokers
	} else if a := demoAddr(getenv("IDEMD_KAFKA_EMBEDDED_ADDR")); a != "" {
		kafkaDef = a
	}
	topicDef := DefaultKafkaTopic
	var cfg demoConfig
	if t := getenv("IDEMD_KAFKA_TOPIC"); t != "" {
		topicDef, cfg.topicSet = t, true
	}
	fs.StringVar(&cfg.url, "url", urlDef, "")
	fs.BoolVar(&cfg.reproduce, "reproduce", true, "")
	fs.StringVar(&cfg.kafka, "kafka", kafkaDef, "")
	fs.StringVar(&cfg.topic, "topic", topicDef, "")
	fs.StringVar(&cfg.token, "token", "", "")
	fs.IntVar(&cfg.orders, "orders", DefaultDemoOrders, "")
	fs.IntVar(&cfg.concurrency, "concurrency", 8, "")
	fs.IntVar(&cfg.attempts, "attempts", DefaultDemoAttempts, "")
	fs.Uint64Var(&cfg.seed, "seed", 0, "")
	fs.DurationVar(&cfg.timeout, "timeout", 2*time.Minute, "")
	authSettings := settingsNamed(kafkaAuthSettings)
	authValues := registerSettings(fs, authSettings, getenv)
	if err := fs.Parse(args); err != nil {
		return demoConfig{}, err
	}
	authSource := func(name string) string {
		for _, s := range authSettings {
			if s.flag == name && !isSet(fs, name) && getenv(s.env) != "" {
				return s.env
			}
		}
		return "-" + name
	}
	authGiven := func(name string) bool { return isSet(fs, name) || authSource(name) != "-"+name }
	auth, err := parseKafkaAuth(func(name string) string { return *authValues[name] }, authGiven, authSource, getenv)
	if err != nil {
		return demoConfig{}, err
	}
	cfg.auth = auth
	cfg.topicSet = cfg.topicSet || isSet(fs, "topic")
	switch {
	case fs.NArg() > 0:
		return demoConfig{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case !strings.HasPrefix(cfg.url, "http://") && !strings.HasPrefix(cfg.url, "https://"):
		return demoConfig{}, fmt.Errorf("-url %s: want http://host:port", redactURL(cfg.url))
	case cfg.orders < 1 || cfg.orders > 100_000:
		return demoConfig{}, fmt.Errorf("-orders %d: want 1 to 100000", cfg.orders)
	case cfg.concurrency < 1 || cfg.concurrency > 256:
		return demoConfig{}, fmt.Errorf("-concurrency %d: want 1 to 256", cfg.concurrency)
	case cfg.attempts < 1 || cfg.attempts > 1000:
		return demoConfig{}, fmt.Errorf("-attempts %d: want 1 to 1000", cfg.attempts)
	case cfg.timeout <= 0:
		return demoConfig{}, fmt.Errorf("-timeout %s: want a positive duration like 2m", cfg.timeout)
	}
	cfg.url = strings.TrimRight(cfg.url, "/")
	u, err := url.Parse(cfg.url)
	if err != nil {
		// Its message quotes the URL, password included.
		return demoConfig{}, fmt.Errorf("-url %s: not a URL (percent-encode a /, ?, # or @ in its password): want http://host:port", redactURL(cfg.url))
	}
	cfg.shownURL = u.Redacted()
	if cfg.kafka = strings.TrimSpace(cfg.kafka); cfg.kafka != "" {
		k, err := ParseKafka(cfg.kafka)
		if err != nil || k.Mode != KafkaBrokers {
			return demoConfig{}, fmt.Errorf("-kafka %q: want the seed brokers host:port[,host:port...] of the running idemd", hideUserInfo(cfg.kafka))
		}
		cfg.kafka = k.Brokers
	}
	if err := CheckTopic(cfg.topic); err != nil {
		return demoConfig{}, fmt.Errorf("-topic: %w", err)
	}
	if cfg.seed == 0 {
		cfg.seed = mrand.Uint64()
	}
	return cfg, nil
}

// demoAddr returns the address a client dials for a listen address, or ""
// when there is none to dial (unset, or port 0).
func demoAddr(listen string) string {
	host, port, err := net.SplitHostPort(strings.TrimSpace(listen))
	if err != nil || port == "" || port == "0" {
		return ""
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// demo is one run of idemd demo.
type demo struct {
	cfg    demoConfig
	log    *slog.Logger
	rng    *mrand.Rand // only the run's goroutine uses it
	runID  string      // in the external IDs of its payments
	base   int64       // the run's customers are base+1..base+customers
	nCust  int
	tr     *demoTransport
	client *idemclient.Client
	orders []*demoOrder
	pays   []*demoPayment
	// kafkaFound: cfg.kafka is what idemd answered at GET /v1/kafka,
	// asked again before step 3.
	kafkaFound bool
}

// demoOrder is one order operation: what is sent, and what came back.
type demoOrder struct {
	customer int64
	amount   decimal.Decimal
	body     []byte
	key      string
	drops    int // responses to lose
	senders  int // clients sending it at once
	res      demoResult
	// Filled in once the order settled.
	id     string
	final  demoObject
	exists bool
}

// demoPayment is one payment operation of an order.
type demoPayment struct {
	order   *demoOrder
	ext     string
	body    []byte
	key     string
	drops   int
	senders int
	// again: the payment is sent once more under a new key (againKey),
	// once it was answered.
	again    bool
	againKey string
	res      demoResult
	// againStatus is the status of that new-key request.
	againStatus int
}

// demoResult collects the answers of one operation.
type demoResult struct {
	mu       sync.Mutex
	ids      map[string]int // id -> answers carrying it
	replayed int
	errs     []string
}

func (r *demoResult) add(id string, replayed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ids == nil {
		r.ids = map[string]int{}
	}
	r.ids[id]++
	if replayed {
		r.replayed++
	}
}

func (r *demoResult) fail(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, msg)
}

// sortedIDs returns the distinct ids answered, in ascending numeric order.
func (r *demoResult) sortedIDs() []string {
	ids := make([]string, 0, len(r.ids))
	for id := range r.ids {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b string) int { return cmpID(a, b) })
	return ids
}

func cmpID(a, b string) int {
	x, _ := strconv.ParseInt(a, 10, 64)
	y, _ := strconv.ParseInt(b, 10, 64)
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// demoObject is an order, a payment or a summary as idemd answers it.
type demoObject struct {
	ID         string `json:"id"`
	CustomerID int64  `json:"customer_id"`
	Amount     string `json:"amount"`
	Status     string `json:"status"`
	PaymentID  string `json:"payment_id"`
	Provider   string `json:"provider"`
	ExternalID string `json:"external_payment_id"`
	// Summary fields.
	Orders      int64  `json:"orders"`
	Confirmed   int64  `json:"confirmed"`
	Rejected    int64  `json:"rejected"`
	TotalAmount string `json:"total_amount"`
	LastOrderID string `json:"last_order_id"`
}

// demoTransport counts the requests and loses responses on purpose: for a
// key with drops left, it sends the request, reads the whole 2xx response
// (idemd executed and committed it) and returns an error instead, as a
// connection reset after the server answered would.
type demoTransport struct {
	next http.RoundTripper
	// maxAttempts is the client's MaxAttempts: a response is never lost
	// once a key has had that many attempts, so that no request's last
	// attempt is (its answer would be lost for good, a failure of the
	// demo's own making: seen when the earlier attempts met an idemd
	// restarting).
	maxAttempts int
	mu          sync.Mutex
	drops       map[string]int
	// POST attempts to the orders and the payments, GET requests, and
	// responses lost.
	orderPosts, paymentPosts, gets, lost int
	// attempts counts the attempts of each Idempotency-Key, and refused
	// those answered 503 store-unavailable: "the command was not
	// executed".
	attempts, refused map[string]int
}

func (t *demoTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.mu.Lock()
	switch {
	case r.Method != http.MethodPost:
		t.gets++
	case strings.HasSuffix(r.URL.Path, "/v1/orders"):
		t.orderPosts++
	case strings.HasSuffix(r.URL.Path, "/v1/payments"):
		t.paymentPosts++
	}
	t.mu.Unlock()
	resp, err := t.next.RoundTrip(r)
	if key := r.Header.Get(idemclient.HeaderKey); key != "" {
		refused := err == nil && demoRefused(resp)
		t.mu.Lock()
		if t.attempts == nil {
			t.attempts, t.refused = map[string]int{}, map[string]int{}
		}
		t.attempts[key]++
		if refused {
			t.refused[key]++
		}
		t.mu.Unlock()
	}
	if err != nil || resp.StatusCode/100 != 2 || !t.drop(r.Header.Get(idemclient.HeaderKey)) {
		return resp, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return nil, errLostResponse
}

// refusedAll reports whether every attempt of key was answered "not
// executed" (demoRefused): the operation did not take effect, as far as
// the server said. An attempt that failed (a transport error, a lost
// response) or got any other answer may have executed the command.
func (t *demoTransport) refusedAll(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return key != "" && t.attempts[key] > 0 && t.refused[key] == t.attempts[key]
}

// demoRefused reports whether resp is a 503 store-unavailable problem, the
// answer that says the command was not executed (idemhttp's store down,
// or idemd's database failing while the handler ran: rolled back). Not
// outcome-unknown, nor 409 request-in-progress: the command may run. It
// reads the body and puts it back for the client.
func demoRefused(resp *http.Response) bool {
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		return false
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(b))
	var p problem.Problem // refuses a document with a member twice, as idemclient does
	return err == nil && json.Unmarshal(b, &p) == nil && p.Type == problem.TypeStoreUnavailable
}

// drop reports whether the response of key is to be lost, and counts it.
func (t *demoTransport) drop(key string) bool {
	if key == "" {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.drops[key] <= 0 || t.attempts[key] >= t.maxAttempts {
		return false
	}
	t.drops[key]--
	t.lost++
	return true
}

func newDemo(cfg demoConfig, log *slog.Logger) (*demo, error) {
	var rnd [4]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, fmt.Errorf("run id: %w", err)
	}
	u := binary.BigEndian.Uint32(rnd[:])
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.MaxIdleConnsPerHost = cfg.concurrency * demoDuplicates
	tr := &demoTransport{next: base, maxAttempts: cfg.attempts, drops: map[string]int{}}
	c, err := idemclient.New(&idemclient.Config{
		HTTPClient:  &http.Client{Transport: tr, Timeout: 30 * time.Second},
		MaxAttempts: cfg.attempts,
		BaseDelay:   50 * time.Millisecond,
		MaxDelay:    demoMaxDelay,
	})
	if err != nil {
		return nil, err
	}
	return &demo{
		cfg:    cfg,
		log:    log,
		rng:    mrand.New(mrand.NewPCG(cfg.seed, cfg.seed^0x9e3779b97f4a7c15)),
		runID:  fmt.Sprintf("%08x", u),
		base:   (1 + int64(u)) * 1_000_000,
		nCust:  max(1, (cfg.orders+4)/5),
		tr:     tr,
		client: c,
	}, nil
}

// run runs the demo and returns its report; an error means it could not
// run at all (idemd unreachable).
func (d *demo) run(ctx context.Context) (*demoReport, error) {
	start := time.Now()
	if err := d.health(ctx); err != nil {
		return nil, err
	}
	rep := &demoReport{cfg: d.cfg, runID: d.runID, base: d.base, customers: d.nCust}
	if err := d.plan(); err != nil {
		return nil, err
	}
	d.log.Info("demo: creating orders", "orders", len(d.orders), "customers", d.nCust, "run", d.runID, "seed", d.cfg.seed)
	d.each(ctx, len(d.orders), func(i int) {
		o := d.orders[i]
		d.send(ctx, "/v1/orders", o.key, o.body, o.senders, &o.res)
	})
	d.planPayments()
	d.log.Info("demo: paying orders", "payments", len(d.pays))
	d.each(ctx, len(d.pays), func(i int) {
		p := d.pays[i]
		d.send(ctx, "/v1/payments", p.key, p.body, p.senders, &p.res)
		if len(p.res.sortedIDs()) == 0 {
			p.again = false // no payment to find under a new key
		}
		if !p.again || ctx.Err() != nil {
			return
		}
		key, err := idemclient.NewKey()
		if err != nil {
			p.res.fail(err.Error())
			return
		}
		p.againKey = key
		p.againStatus = d.send(ctx, "/v1/payments", key, p.body, 1, &p.res)
	})
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// -timeout bounds the settling, from here: sending may take longer
	// than it (many orders, a slow idemd, its database restarting).
	deadline := time.Now().Add(d.cfg.timeout)
	d.log.Info("demo: waiting for the order sagas")
	d.waitOrders(ctx, deadline)

	settled := true
	if d.kafkaFound {
		// idemd may have been restarted since it was asked (a crash, a
		// deploy), its embedded broker now on another free port.
		kctx, kcancel := context.WithTimeout(ctx, 10*time.Second)
		d.discoverKafka(kctx)
		kcancel()
	}
	if d.cfg.kafka != "" {
		d.log.Info("demo: producing the run's Kafka records again", "kafka", d.cfg.kafka, "topic", d.cfg.topic)
		before := d.inboxDuplicates(ctx)
		rep.kafka = d.reproduce(ctx, deadline)
		settled = rep.kafka.err == nil
		if after := d.inboxDuplicates(ctx); before != nil && after != nil {
			rep.dropped = map[string]float64{}
			for c, n := range after {
				rep.dropped[c] = n - before[c]
			}
		}
	}
	d.log.Info("demo: waiting for the projection")
	d.waitSummaries(ctx, deadline, settled)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d.log.Info("demo: reading what idemd holds")
	if err := d.check(ctx, rep); err != nil {
		return nil, err
	}
	rep.elapsed = time.Since(start)
	return rep, nil
}

// demoStartWait is how long the demo waits for idemd to answer: "go run
// ./cmd/idemd &" then "go run ./cmd/idemd demo" may start the demo while
// idemd is still being built.
const demoStartWait = 2 * time.Minute

// health checks that idemd answers before anything is sent, waiting for it
// up to demoStartWait.
func (d *demo) health(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(ctx, demoStartWait)
	defer cancel()
	var (
		status int
		err    error
	)
	for waited := false; ; waited = true {
		actx, acancel := context.WithTimeout(wctx, 10*time.Second)
		status, _, err = d.getRaw(actx, "/healthz")
		acancel()
		if err == nil || wctx.Err() != nil {
			break
		}
		if !waited {
			d.log.Info("demo: idemd does not answer yet; waiting for it", "url", d.cfg.shownURL, "up_to", demoStartWait.String())
		}
		select {
		case <-wctx.Done():
		case <-time.After(time.Second):
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("idemd at %s: stopped while waiting for it to answer: %w", d.cfg.shownURL, err)
		}
		return fmt.Errorf("idemd at %s does not answer (waited %s): %w", d.cfg.shownURL, demoStartWait, err)
	}
	hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
	defer hcancel()
	if status != http.StatusOK {
		return fmt.Errorf("idemd at %s: GET /healthz answered %d", d.cfg.shownURL, status)
	}
	// With -kafka off no saga and no projection run: nothing would settle.
	// One attempt: idemclient would retry the 503.
	req, err := http.NewRequestWithContext(hctx, http.MethodGet,
		d.cfg.url+"/v1/customers/"+strconv.FormatInt(d.base+1, 10)+"/summary", nil)
	if err != nil {
		return err
	}
	d.authorize(req)
	resp, err := (&http.Client{Transport: d.tr}).Do(req)
	if err != nil {
		return fmt.Errorf("idemd at %s: %w", d.cfg.shownURL, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	_ = resp.Body.Close()
	if resp.StatusCode == http.StatusServiceUnavailable {
		return fmt.Errorf("idemd at %s runs with -kafka off: no order saga and no projection to check", d.cfg.shownURL)
	}
	if d.cfg.reproduce && d.cfg.kafka == "" {
		d.discoverKafka(hctx)
	}
	return nil
}

// discoverKafka asks idemd (GET /v1/kafka) for its seed brokers and topic,
// for step 3 without -kafka. An idemd that does not tell leaves step 3
// skipped, or, asked again, the brokers it told before.
func (d *demo) discoverKafka(ctx context.Context) {
	status, b, err := d.getRaw(ctx, "/v1/kafka")
	if err != nil || status != http.StatusOK {
		return
	}
	var info struct {
		Seeds []string `json:"seeds"`
		Topic string   `json:"topic"`
	}
	if json.Unmarshal(b, &info) != nil || len(info.Seeds) == 0 {
		return
	}
	d.cfg.kafka = strings.Join(info.Seeds, ",")
	d.kafkaFound = true
	if !d.cfg.topicSet && CheckTopic(info.Topic) == nil {
		d.cfg.topic = info.Topic
	}
}

// plan draws the orders and their faults; order 0 loses its responses and
// order 1 is sent by several clients at once, so that every run has both.
func (d *demo) plan() error {
	d.orders = make([]*demoOrder, d.cfg.orders)
	for i := range d.orders {
		var amount decimal.Decimal
		if i%10 == 7 { // over the payment limit: the saga rejects it
			amount = orders.PaymentLimit.Add(decimal.New(100+d.rng.Int64N(500_000), -2))
		} else {
			amount = decimal.New(100+d.rng.Int64N(99_900), -2)
		}
		customer := d.base + 1 + int64(i%d.nCust)
		key, err := idemclient.NewKey()
		if err != nil {
			return err
		}
		o := &demoOrder{customer: customer, amount: amount, key: key, senders: 1,
			body: fmt.Appendf(nil, `{"customer_id":%d,"amount":%q,"items":[{"sku":"DEMO-%d","quantity":%d}]}`,
				customer, amount.StringFixed(2), i%7, 1+i%3)}
		o.drops, o.senders = d.faults(i)
		d.tr.drops[key] = o.drops
		d.orders[i] = o
	}
	return nil
}

// faults draws the faults of operation i: responses to lose, and how many
// clients send it at once.
func (d *demo) faults(i int) (drops, senders int) {
	senders = 1
	if i == 0 || d.rng.IntN(100) < 30 {
		drops = 1 + d.rng.IntN(2)
	}
	if i == 1 || d.rng.IntN(100) < 20 {
		senders = demoDuplicates
	}
	return drops, senders
}

// planPayments draws the payments: about half the orders created, the
// first always; every other one is sent again under a new key.
func (d *demo) planPayments() {
	for i, o := range d.orders {
		ids := o.res.sortedIDs()
		if len(ids) == 0 || (i > 0 && d.rng.IntN(2) == 0) {
			continue
		}
		ext := "demo-" + d.runID + "-order-" + ids[0]
		key, err := idemclient.NewKey()
		if err != nil {
			o.res.fail(err.Error())
			continue
		}
		p := &demoPayment{order: o, ext: ext, key: key, again: len(d.pays)%2 == 0,
			body: fmt.Appendf(nil, `{"provider":%q,"external_payment_id":%q,"amount":%q,"customer_id":%d}`,
				demoProvider, ext, o.amount.StringFixed(2), o.customer)}
		p.drops, p.senders = d.faults(len(d.pays))
		d.tr.mu.Lock()
		d.tr.drops[key] = p.drops
		d.tr.mu.Unlock()
		d.pays = append(d.pays, p)
	}
}

// each runs fn(0..n-1) on cfg.concurrency goroutines.
func (d *demo) each(ctx context.Context, n int, fn func(i int)) {
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(n, d.cfg.concurrency) {
		wg.Go(func() {
			for i := range next {
				fn(i)
			}
		})
	}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
}

// send posts body to path under key from senders clients at once, each
// with idemclient's retries, recording the ids answered in res. It returns
// the status of the last answer.
func (d *demo) send(ctx context.Context, path, key string, body []byte, senders int, res *demoResult) int {
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		last   int
		start  = make(chan struct{})
		target = d.cfg.url + path
	)
	for range senders {
		wg.Go(func() {
			<-start // all at once
			status := d.post(ctx, target, key, body, res)
			mu.Lock()
			last = status
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	return last
}

// post sends one POST with idemclient and records its answer.
func (d *demo) post(ctx context.Context, target, key string, body []byte, res *demoResult) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		res.fail(err.Error())
		return 0
	}
	req.Header.Set("Content-Type", "application/json")
	d.authorize(req)
	if req, err = idemclient.WithKey(req, key); err != nil {
		res.fail(err.Error())
		return 0
	}
	resp, err := d.client.Do(req)
	if err != nil {
		res.fail(err.Error())
		return 0
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		res.fail(fmt.Sprintf("POST %s: read the response: %v", target, err))
		return 0
	}
	var obj demoObject
	if resp.StatusCode/100 != 2 || json.Unmarshal(b, &obj) != nil || obj.ID == "" {
		res.fail(fmt.Sprintf("POST %s: %d %s", target, resp.StatusCode, clipDemo(string(b), 200)))
		return resp.StatusCode
	}
	res.add(obj.ID, idemclient.Replayed(resp))
	return resp.StatusCode
}

func (d *demo) authorize(req *http.Request) {
	if d.cfg.token != "" {
		req.Header.Set("Authorization", "Bearer "+d.cfg.token)
	}
}

// get reads path; a 404 is a status, not an error.
func (d *demo) get(ctx context.Context, path string) (int, demoObject, error) {
	status, b, err := d.getRaw(ctx, path)
	var obj demoObject
	if err == nil && status == http.StatusOK {
		if err := json.Unmarshal(b, &obj); err != nil {
			return 0, demoObject{}, fmt.Errorf("GET %s: %w", path, err)
		}
	}
	return status, obj, err
}

// getRaw reads path and returns its status and body.
func (d *demo) getRaw(ctx context.Context, path string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.cfg.url+path, nil)
	if err != nil {
		return 0, nil, err
	}
	d.authorize(req)
	resp, err := d.client.Do(req)
	var ra *idemclient.RetryAfterError
	if errors.As(err, &ra) {
		// An answer asking for a later retry than the client waits
		// (GET /healthz's 503 has Retry-After: 5): a status all the same.
		return ra.StatusCode, nil, nil
	}
	if err != nil {
		return 0, nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return 0, nil, fmt.Errorf("GET %s: %w", path, err)
	}
	return resp.StatusCode, b, nil
}

// inboxDuplicates reads the inboxes' duplicate counters from GET /metrics
// (of the replica that answers), by inbox consumer; nil when unavailable.
func (d *demo) inboxDuplicates(ctx context.Context) map[string]float64 {
	status, b, err := d.getRaw(ctx, "/metrics")
	if err != nil || status != http.StatusOK {
		return nil
	}
	out := map[string]float64{}
	for line := range strings.Lines(string(b)) {
		for _, c := range []string{ProjectionInbox, SagaInbox} {
			prefix := `idemd_inbox_events_total{consumer="` + c + `",result="duplicate"} `
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
				if n, err := strconv.ParseFloat(v, 64); err == nil {
					out[c] = n
				}
			}
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// waitOrders polls the orders until none is CREATED, or deadline.
func (d *demo) waitOrders(ctx context.Context, deadline time.Time) {
	for _, o := range d.orders {
		if ids := o.res.sortedIDs(); len(ids) > 0 {
			o.id = ids[0]
		}
	}
	pending := slices.DeleteFunc(slices.Clone(d.orders), func(o *demoOrder) bool { return o.id == "" })
	for len(pending) > 0 && ctx.Err() == nil {
		d.each(ctx, len(pending), func(i int) {
			o := pending[i]
			status, obj, err := d.get(ctx, "/v1/orders/"+o.id)
			if err == nil && status == http.StatusOK {
				o.final, o.exists = obj, true
			}
		})
		pending = slices.DeleteFunc(pending, func(o *demoOrder) bool {
			return o.exists && o.final.Status != orders.StatusCreated
		})
		if len(pending) == 0 || time.Now().After(deadline) {
			return
		}
		demoSleep(ctx, 200*time.Millisecond)
	}
}

func demoSleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// wantEvents returns the event types each order of the run must have in
// Kafka, by its final status.
func (d *demo) wantEvents() map[string][]string {
	want := map[string][]string{}
	for _, o := range d.orders {
		if !o.exists {
			continue
		}
		switch o.final.Status {
		case orders.StatusConfirmed:
			want[o.id] = []string{orders.EventOrderCreated, orders.EventPaymentCaptured, orders.EventOrderConfirmed}
		case orders.StatusRejected:
			want[o.id] = []string{orders.EventOrderCreated, orders.EventOrderRejected}
		default:
			want[o.id] = []string{orders.EventOrderCreated}
		}
	}
	return want
}

// demoKafka is what step 3 did.
type demoKafka struct {
	read, produced int
	// expected and found (order, event type) pairs; dupIDs counts the
	// extra distinct event IDs of a pair (an event emitted twice).
	expected, found, dupIDs int
	missing                 []string
	err                     error
}

// reproduce reads the topic from the start until it has every expected
// event of the run and has reached the end offsets, produces each record
// of the run again 2 or 3 times to its partition, and waits until both
// consumer groups committed past them.
func (d *demo) reproduce(ctx context.Context, deadline time.Time) demoKafka {
	var res demoKafka
	auth, err := d.cfg.auth.kgoOpts(kafkaDialTimeout)
	if err != nil {
		res.err = fmt.Errorf("kafka client: %w", err)
		return res
	}
	conns := &connFailures{}
	cl, err := kgo.NewClient(append(auth,
		kgo.WithHooks(conns),
		kgo.SeedBrokers(strings.Split(d.cfg.kafka, ",")...),
		kgo.ConsumeTopics(d.cfg.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(500*time.Millisecond),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
	)...)
	if err != nil {
		res.err = fmt.Errorf("kafka client: %w", err)
		return res
	}
	defer cl.Close()
	kctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if err := cl.Ping(kctx); err != nil {
		if msg := kafkaRefusal(d.cfg.kafka, d.cfg.auth, d.cfg.topic, err, conns); msg != "" {
			res.err = errors.New(msg)
		} else {
			res.err = fmt.Errorf("kafka %s unreachable: %w", d.cfg.kafka, kafkaCause(err, conns))
		}
		return res
	}
	adm := kadm.NewClient(cl)

	want := d.wantEvents()
	for _, ts := range want {
		res.expected += len(ts)
	}
	seen := map[string]map[string]map[string]bool{} // order -> type -> event IDs
	var (
		records []*kgo.Record
		pos     = map[int32]int64{}
		end     kadm.ListedOffsets
		start   kadm.ListedOffsets
	)
	for {
		pctx, pcancel := context.WithTimeout(kctx, time.Second)
		fs := cl.PollFetches(pctx)
		pcancel()
		fs.EachError(func(_ string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				d.log.Warn("demo: kafka fetch", "partition", p, "err", err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			pos[r.Partition] = r.Offset + 1
			res.read++
			key := string(r.Key)
			if _, ok := want[key]; !ok {
				return
			}
			records = append(records, r)
			typ, id := demoTypeID(r)
			if seen[key] == nil {
				seen[key] = map[string]map[string]bool{}
			}
			if seen[key][typ] == nil {
				seen[key][typ] = map[string]bool{}
			}
			seen[key][typ][id] = true
		})
		if end == nil && demoAllSeen(want, seen) {
			if start, err = adm.ListStartOffsets(kctx, d.cfg.topic); err == nil {
				end, err = adm.ListEndOffsets(kctx, d.cfg.topic)
			}
			if err != nil {
				res.err = fmt.Errorf("kafka: list offsets of %s: %w", d.cfg.topic, err)
				return res
			}
		}
		// Reached the end offsets, or an idle poll once they are known
		// (a partition ending with control records is never "reached").
		if end != nil && (demoReached(end, start, pos, d.cfg.topic) || fs.NumRecords() == 0) {
			break
		}
		if kctx.Err() != nil {
			break // report what is missing
		}
	}
	for o, ts := range want {
		for _, t := range ts {
			if n := len(seen[o][t]); n > 0 {
				res.found++
				res.dupIDs += n - 1
			} else {
				res.missing = append(res.missing, t+" of order "+o)
			}
		}
	}
	slices.Sort(res.missing)
	if len(records) == 0 {
		res.err = fmt.Errorf("kafka: no record of the run in topic %s within the timeout", d.cfg.topic)
		return res
	}

	var again []*kgo.Record
	for _, r := range records {
		for range 2 + d.rng.IntN(2) {
			again = append(again, &kgo.Record{Topic: r.Topic, Partition: r.Partition,
				Key: r.Key, Value: r.Value, Headers: slices.Clone(r.Headers)})
		}
	}
	results := cl.ProduceSync(kctx, again...)
	if err := results.FirstErr(); err != nil {
		res.err = fmt.Errorf("kafka: produce again: %w", err)
		return res
	}
	res.produced = len(again)
	upTo := map[int32]int64{}
	for _, pr := range results {
		upTo[pr.Record.Partition] = max(upTo[pr.Record.Partition], pr.Record.Offset+1)
	}
	d.log.Info("demo: records produced again; waiting for the consumer groups", "records", res.produced,
		"groups", ProjectionGroup+","+SagaGroup)
	for _, g := range []string{ProjectionGroup, SagaGroup} {
		if err := d.waitGroup(kctx, adm, g, upTo); err != nil {
			res.err = err
			return res
		}
	}
	return res
}

// waitGroup waits until group has committed offsets at or past upTo on
// every partition of the topic.
func (d *demo) waitGroup(ctx context.Context, adm *kadm.Client, group string, upTo map[int32]int64) error {
	var behind []string
	for {
		offs, err := adm.FetchOffsetsForTopics(ctx, group, d.cfg.topic)
		if err == nil {
			behind = behind[:0]
			for p, want := range upTo {
				o, ok := offs.Lookup(d.cfg.topic, p)
				if !ok || o.At < want {
					behind = append(behind, fmt.Sprintf("partition %d at %d of %d", p, o.At, want))
				}
			}
			if len(behind) == 0 {
				return nil
			}
		}
		if ctx.Err() != nil {
			if err != nil {
				return fmt.Errorf("kafka: consumer group %s: %w", group, err)
			}
			slices.Sort(behind)
			return fmt.Errorf("kafka: consumer group %s did not read past the records produced again within -timeout (%s)",
				group, strings.Join(behind, ", "))
		}
		demoSleep(ctx, 250*time.Millisecond)
	}
}

// demoTypeID returns the event type and ID of r, from idem's headers or
// CloudEvents' (idemd's -kafka-headers: idem, cloudevents or both).
func demoTypeID(r *kgo.Record) (typ, id string) {
	typ, id = demoHeader(r, event.HeaderEventType), demoHeader(r, event.HeaderEventID)
	if typ == "" {
		typ = demoHeader(r, event.HeaderCEType)
	}
	if id == "" {
		id = demoHeader(r, event.HeaderCEID)
	}
	return typ, id
}

func demoHeader(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func demoAllSeen(want map[string][]string, seen map[string]map[string]map[string]bool) bool {
	for o, ts := range want {
		for _, t := range ts {
			if len(seen[o][t]) == 0 {
				return false
			}
		}
	}
	return true
}

// demoReached reports whether the positions read reach the end offsets of
// every non-empty partition.
func demoReached(end, start kadm.ListedOffsets, pos map[int32]int64, topic string) bool {
	for p, e := range end[topic] {
		s, _ := start.Lookup(topic, p)
		if e.Offset > s.Offset && pos[p] < e.Offset {
			return false
		}
	}
	return true
}

// customers returns the run's customer IDs.
func (d *demo) customers() []int64 {
	ids := make([]int64, d.nCust)
	for i := range ids {
		ids[i] = d.base + 1 + int64(i)
	}
	return ids
}

func (d *demo) ours(customer int64) bool {
	return customer > d.base && customer <= d.base+int64(d.nCust)
}

// summaries reads the run's customer summaries (missing ones are absent).
func (d *demo) summaries(ctx context.Context) (map[int64]demoObject, error) {
	cs := d.customers()
	out := make([]demoObject, len(cs))
	found := make([]bool, len(cs))
	errs := make([]error, len(cs))
	d.each(ctx, len(cs), func(i int) {
		status, obj, err := d.get(ctx, "/v1/customers/"+strconv.FormatInt(cs[i], 10)+"/summary")
		switch {
		case err != nil:
			errs[i] = err
		case status == http.StatusOK:
			out[i], found[i] = obj, true
		case status != http.StatusNotFound:
			errs[i] = fmt.Errorf("GET /v1/customers/%d/summary: %d", cs[i], status)
		}
	})
	m := map[int64]demoObject{}
	for i, c := range cs {
		if found[i] {
			m[c] = out[i]
		}
	}
	return m, errors.Join(errs...)
}

// wantSummaries is what the summaries must say of the orders in list,
// by their status and Amount (the callers put the amount sent there).
func (d *demo) wantSummaries(list []demoObject) map[int64]demoObject {
	want := map[int64]demoObject{}
	for _, c := range d.customers() {
		want[c] = demoObject{CustomerID: c, TotalAmount: decimal.Zero.StringFixed(orders.AmountScale)}
	}
	for _, o := range list {
		w := want[o.CustomerID]
		w.Orders++
		switch o.Status {
		case orders.StatusConfirmed:
			w.Confirmed++
			a, _ := decimal.NewFromString(o.Amount)
			t, _ := decimal.NewFromString(w.TotalAmount)
			w.TotalAmount = t.Add(a).StringFixed(orders.AmountScale)
		case orders.StatusRejected:
			w.Rejected++
		}
		want[o.CustomerID] = w
	}
	return want
}

// summaryKey formats the counters of a summary, for comparisons.
func summaryKey(s demoObject) string {
	total, _ := decimal.NewFromString(s.TotalAmount) // "" (no summary) is 0
	return fmt.Sprintf("%d/%d/%d/%s", s.Orders, s.Confirmed, s.Rejected, total.StringFixed(orders.AmountScale))
}

// waitSummaries polls the summaries until they match the orders, or stay
// unchanged for demoQuiet (once the consumers read everything: settled),
// or deadline.
func (d *demo) waitSummaries(ctx context.Context, deadline time.Time, settled bool) {
	var list []demoObject
	for _, o := range d.orders {
		if o.exists {
			f := o.final
			f.Amount = o.amount.StringFixed(orders.AmountScale) // the amount sent is due
			list = append(list, f)
		}
	}
	want := d.wantSummaries(list)
	quiet := demoQuiet
	if !settled {
		quiet = 2 * demoQuiet
	}
	last, since := "", time.Now()
	for ctx.Err() == nil && time.Now().Before(deadline) {
		got, err := d.summaries(ctx)
		var b strings.Builder
		match := err == nil
		for _, c := range d.customers() {
			b.WriteString(summaryKey(got[c]) + ";")
			match = match && summaryKey(got[c]) == summaryKey(want[c])
		}
		if match {
			return
		}
		if b.String() != last {
			last, since = b.String(), time.Now()
		} else if time.Since(since) > quiet {
			return
		}
		demoSleep(ctx, 250*time.Millisecond)
	}
}

// scan reads path+id for every id from the lowest to the highest of known,
// then past both ends, demoScanSlack ids at a time, until a whole batch
// holds nothing of the run. It returns the run's objects by id. idemd has
// no list endpoint: this is how an object created twice (whose id no
// client ever saw) shows up.
func (d *demo) scan(ctx context.Context, path string, known []int64) (map[int64]demoObject, error) {
	found := map[int64]demoObject{}
	if len(known) == 0 {
		return found, nil
	}
	var mu sync.Mutex
	var errs []error
	fetch := func(ids []int64) int {
		n := 0
		d.each(ctx, len(ids), func(i int) {
			status, obj, err := d.get(ctx, path+strconv.FormatInt(ids[i], 10))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				errs = append(errs, err)
			case status == http.StatusOK && d.ours(obj.CustomerID):
				found[ids[i]] = obj
				n++
			case status != http.StatusOK && status != http.StatusNotFound:
				errs = append(errs, fmt.Errorf("GET %s%d: %d", path, ids[i], status))
			}
		})
		return n
	}
	lo, hi := slices.Min(known), slices.Max(known)
	ids := make([]int64, 0, hi-lo+1)
	for id := lo; id <= hi; id++ {
		ids = append(ids, id)
	}
	fetch(ids)
	for from := lo - 1; from >= 1; from -= demoScanSlack {
		ids = ids[:0]
		for id := from; id > from-demoScanSlack && id >= 1; id-- {
			ids = append(ids, id)
		}
		if fetch(ids) == 0 {
			break
		}
	}
	for from := hi + 1; ; from += demoScanSlack {
		ids = ids[:0]
		for id := from; id < from+demoScanSlack; id++ {
			ids = append(ids, id)
		}
		if fetch(ids) == 0 {
			break
		}
	}
	return found, errors.Join(errs...)
}

// check reads what idemd holds and fills rep.
func (d *demo) check(ctx context.Context, rep *demoReport) error {
	sums, err := d.summaries(ctx)
	if err != nil {
		return fmt.Errorf("read the summaries: %w", err)
	}
	// Orders: from the ids answered, and the summaries' last orders (an
	// order no client was answered is found even when every operation
	// was refused).
	var known []int64
	for _, o := range d.orders {
		for id := range o.res.ids {
			n, _ := strconv.ParseInt(id, 10, 64)
			known = append(known, n)
		}
	}
	for _, sum := range sums {
		if n, err := strconv.ParseInt(sum.LastOrderID, 10, 64); err == nil && n > 0 {
			known = append(known, n)
		}
	}
	ords, err := d.scan(ctx, "/v1/orders/", known)
	if err != nil {
		return fmt.Errorf("read the orders: %w", err)
	}
	// Payments: the demo's and the sagas'.
	known = known[:0]
	for _, p := range d.pays {
		for id := range p.res.ids {
			n, _ := strconv.ParseInt(id, 10, 64)
			known = append(known, n)
		}
	}
	for _, o := range ords {
		if n, err := strconv.ParseInt(o.PaymentID, 10, 64); err == nil {
			known = append(known, n)
		}
	}
	pays, err := d.scan(ctx, "/v1/payments/", known)
	if err != nil {
		return fmt.Errorf("read the payments: %w", err)
	}
	rep.fill(d, ords, pays, sums)
	return nil
}

// demoRow is a line of the table; -1 is "not applicable".
type demoRow struct {
	name                               string
	sent, distinct, held, double, lost int
	// refused counts the operations answered "not executed" on every
	// attempt (demoTransport.refusedAll), without an effect: not lost.
	refused int
	note    string
}

// demoMoney is what the run's money adds up to, each sum in its place.
type demoMoney struct {
	// confirmed: the amounts the clients sent for the orders that must
	// end CONFIRMED; charged: the saga charges held; projected: the
	// summaries' total_amount.
	confirmed, charged, projected decimal.Decimal
	// paySent: the amounts sent for the payments held that a client was
	// answered with; paid: the run's payments held (demo-psp).
	paySent, paid decimal.Decimal
}

// demoReport is the outcome of a run.
type demoReport struct {
	cfg       demoConfig
	runID     string
	base      int64
	customers int
	rows      []demoRow
	problems  []string
	money     demoMoney
	kafka     demoKafka
	// dropped is how many duplicates each inbox dropped during step 3,
	// from idemd's /metrics; nil when unknown.
	dropped map[string]float64
	// Counts of the faults.
	gets, lostResp, dupOps, newKey, replayed int
	// refusedAgain counts the payments sent again under a new key whose
	// re-send was refused on every attempt.
	refusedAgain int
	elapsed      time.Duration
}

func (r *demoReport) problemf(format string, args ...any) {
	r.problems = append(r.problems, fmt.Sprintf(format, args...))
}

// ok reports whether every invariant holds.
func (r *demoReport) ok() bool {
	for _, row := range r.rows {
		if row.double > 0 || row.lost > 0 {
			return false
		}
	}
	return len(r.problems) == 0
}

// fill computes the table from the operations and what idemd holds.
func (r *demoReport) fill(d *demo, ords, pays, sums map[int64]demoObject) {
	d.tr.mu.Lock()
	ordersSent, paysSent := d.tr.orderPosts, d.tr.paymentPosts
	r.gets, r.lostResp = d.tr.gets, d.tr.lost
	d.tr.mu.Unlock()
	defer slices.Sort(r.problems)

	// Orders: one per operation.
	row := demoRow{name: "orders", sent: ordersSent, distinct: len(d.orders), held: len(ords)}
	answered := map[string]*demoOrder{} // order ID -> the operation answered with it
	for i, o := range d.orders {
		r.count(o.senders, &o.res)
		ids := o.res.sortedIDs()
		for _, id := range ids {
			answered[id] = o
		}
		if len(ids) > 1 {
			row.double += len(ids) - 1
			r.problemf("order operation %d was answered with %d orders: %s", i, len(ids), strings.Join(ids, ", "))
		}
		switch {
		case len(ids) == 0 && d.tr.refusedAll(o.key):
			// Not executed, said every answer: if it was all the same,
			// its order is held and was never answered (below).
			row.refused++
		case len(ids) == 0 || !slices.ContainsFunc(ids, func(id string) bool { return ords[demoID(id)].ID != "" }):
			row.lost++
			r.problemf("order operation %d has no order: %s", i, strings.Join(o.res.errs, "; "))
		}
	}
	if row.refused == len(d.orders) {
		r.problemf("every order operation was refused (503 store-unavailable on each of its %d attempts): nothing was shown; is idemd's database up?",
			d.cfg.attempts)
	}
	// due is the amount each order must have been held, charged and
	// projected with: the one its client sent (or, for an order no client
	// was answered, a double effect already, the one it holds).
	due := make(map[int64]decimal.Decimal, len(ords))
	for id, o := range ords {
		held, _ := decimal.NewFromString(o.Amount)
		due[id] = held
		op := answered[o.ID]
		if op == nil {
			row.double++
			r.problemf("order %d of customer %d was never answered to a client: created twice, or by an operation answered \"not executed\"",
				id, o.CustomerID)
			continue
		}
		due[id] = op.amount
		if !held.Equal(op.amount) || o.CustomerID != op.customer {
			r.problemf("order %d holds amount %s of customer %d; the client sent %s for customer %d",
				id, o.Amount, o.CustomerID, op.amount.StringFixed(orders.AmountScale), op.customer)
		}
	}
	r.rows = append(r.rows, row)

	// Payments sent through the API: one per operation, whatever the key.
	row = demoRow{name: "payments", sent: paysSent, distinct: len(d.pays)}
	returned := map[string]*demoPayment{} // payment ID -> the operation answered with it
	for i, p := range d.pays {
		r.count(p.senders, &p.res)
		if p.again {
			r.newKey++
			if d.tr.refusedAll(p.againKey) {
				r.refusedAgain++ // its payment is checked below, as any
			} else if p.againStatus != http.StatusOK {
				r.problemf("payment %s sent again under a new key: status %d, want 200 (the existing payment)", p.ext, p.againStatus)
			}
		}
		ids := p.res.sortedIDs()
		for _, id := range ids {
			returned[id] = p
		}
		if len(ids) > 1 {
			row.double += len(ids) - 1
			r.problemf("payment operation %d (%s) was answered with %d payments: %s", i, p.ext, len(ids), strings.Join(ids, ", "))
		}
		switch {
		case len(ids) == 0 && d.tr.refusedAll(p.key):
			row.refused++
		case len(ids) == 0 || pays[demoID(ids[0])].ID == "":
			row.lost++
			r.problemf("payment operation %d (%s) has no payment: %s", i, p.ext, strings.Join(p.res.errs, "; "))
		}
	}
	var money demoMoney
	sagaPays := map[string][]demoObject{} // external id -> payments
	for id, p := range pays {
		switch {
		case p.Provider == demoProvider && strings.HasPrefix(p.ExternalID, "demo-"+d.runID+"-"):
			row.held++
			held, _ := decimal.NewFromString(p.Amount)
			money.paid = money.paid.Add(held)
			op := returned[p.ID]
			if op == nil {
				row.double++
				r.problemf("payment %d (%s) was never answered to a client: created twice, or by an operation answered \"not executed\"",
					id, p.ExternalID)
				continue
			}
			money.paySent = money.paySent.Add(op.order.amount)
			if !held.Equal(op.order.amount) || p.CustomerID != op.order.customer {
				r.problemf("payment %d (%s) holds amount %s of customer %d; the client sent %s for customer %d",
					id, p.ExternalID, p.Amount, p.CustomerID, op.order.amount.StringFixed(orders.AmountScale), op.order.customer)
			}
		case p.Provider == orders.SagaProvider:
			sagaPays[p.ExternalID] = append(sagaPays[p.ExternalID], p)
		default:
			row.double++
			r.problemf("payment %d (%s %s) of customer %d was never sent", id, p.Provider, p.ExternalID, p.CustomerID)
		}
	}
	r.rows = append(r.rows, row)

	// The sagas' charges: one per confirmed order, none for the others;
	// and every order in its final state.
	charges := demoRow{name: "saga charges", sent: -1, refused: -1}
	outcomes := demoRow{name: "order outcomes", sent: -1, distinct: len(ords), double: -1, refused: -1}
	for id, o := range ords {
		amount := due[id]
		want := orders.StatusConfirmed
		if amount.GreaterThan(orders.PaymentLimit) {
			want = orders.StatusRejected
		}
		ps := sagaPays[orders.SagaID(id)]
		delete(sagaPays, orders.SagaID(id))
		charges.held += len(ps)
		for _, p := range ps {
			charged, _ := decimal.NewFromString(p.Amount)
			money.charged = money.charged.Add(charged)
			if !charged.Equal(amount) || p.CustomerID != o.CustomerID || p.Status != payments.StatusCaptured {
				r.problemf("order %d (%s, customer %d) was charged %s to customer %d by payment %s (%s), want %s %s",
					id, amount.StringFixed(orders.AmountScale), o.CustomerID, p.Amount, p.CustomerID, p.ID, p.Status,
					amount.StringFixed(orders.AmountScale), payments.StatusCaptured)
			}
		}
		if want == orders.StatusConfirmed {
			money.confirmed = money.confirmed.Add(amount)
			charges.distinct++
			if len(ps) == 0 {
				charges.lost++
				r.problemf("order %d (%s) has no payment from its saga", id, o.Amount)
			}
			charges.double += max(0, len(ps)-1)
		} else if len(ps) > 0 {
			charges.double += len(ps)
			r.problemf("order %d (%s, over the limit) was charged %d time(s)", id, o.Amount, len(ps))
		}
		if o.Status == want && (want != orders.StatusConfirmed || (len(ps) == 1 && o.PaymentID == ps[0].ID)) {
			outcomes.held++
		} else {
			outcomes.lost++
			r.problemf("order %d (%s) is %s with payment %q, want %s", id, o.Amount, o.Status, o.PaymentID, want)
		}
	}
	for ext, ps := range sagaPays {
		charges.held += len(ps)
		charges.double += len(ps)
		for _, p := range ps {
			charged, _ := decimal.NewFromString(p.Amount)
			money.charged = money.charged.Add(charged)
		}
		r.problemf("saga payment %s of the run's customers matches no order of the run", ext)
	}
	r.rows = append(r.rows, charges, outcomes)

	// The projection: each order counted once, each outcome once.
	list := make([]demoObject, 0, len(ords))
	for id, o := range ords {
		o.Amount = due[id].StringFixed(orders.AmountScale)
		list = append(list, o)
	}
	proj := demoRow{name: "projection", sent: -1, refused: -1}
	for c, w := range d.wantSummaries(list) {
		g := sums[c]
		total, _ := decimal.NewFromString(g.TotalAmount) // "" (no summary) is 0
		money.projected = money.projected.Add(total)
		for _, f := range [][2]int64{{w.Orders, g.Orders}, {w.Confirmed, g.Confirmed}, {w.Rejected, g.Rejected}} {
			proj.distinct += int(f[0])
			proj.held += int(f[1])
			proj.double += int(max(0, f[1]-f[0]))
			proj.lost += int(max(0, f[0]-f[1]))
		}
		if summaryKey(g) != summaryKey(w) {
			r.problemf("summary of customer %d: orders/confirmed/rejected/total %s, want %s", c, summaryKey(g), summaryKey(w))
		}
	}
	r.rows = append(r.rows, proj)

	// Money: the sums that must agree, whatever the counts say.
	r.money = money
	if !money.charged.Equal(money.confirmed) || !money.projected.Equal(money.confirmed) {
		r.problemf("money: the orders to confirm amount to %s, their saga charges to %s and the summaries' total_amount to %s",
			money.confirmed.StringFixed(orders.AmountScale), money.charged.StringFixed(orders.AmountScale),
			money.projected.StringFixed(orders.AmountScale))
	}
	if !money.paid.Equal(money.paySent) {
		r.problemf("money: the payments the clients were answered amount to %s as sent and to %s as held",
			money.paySent.StringFixed(orders.AmountScale), money.paid.StringFixed(orders.AmountScale))
	}

	// Kafka: every event of the run there once (by event ID).
	k := r.kafka
	if d.cfg.kafka == "" {
		note := "skipped: idemd told no Kafka brokers (give -kafka)"
		if !d.cfg.reproduce {
			note = "skipped: -reproduce=false"
		}
		r.rows = append(r.rows, demoRow{name: "kafka events", note: note})
		return
	}
	r.rows = append(r.rows, demoRow{name: "kafka events", sent: k.produced, distinct: k.expected,
		held: k.found, double: k.dupIDs, lost: len(k.missing), refused: -1})
	for _, m := range k.missing {
		r.problemf("kafka: no %s in topic %s", m, d.cfg.topic)
	}
	if k.err != nil {
		r.problemf("%s", errMessage(k.err))
	}
}

// count adds an operation's faults to the totals.
func (r *demoReport) count(senders int, res *demoResult) {
	if senders > 1 {
		r.dupOps++
	}
	r.replayed += res.replayed
}

func demoID(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// print writes the report.
func (r *demoReport) print(w io.Writer) {
	kafka := "kafka " + r.cfg.kafka + ", topic " + r.cfg.topic
	if r.cfg.kafka == "" {
		kafka = "no kafka"
	}
	_, _ = fmt.Fprintf(w, "idemd demo against %s (%s)\n", r.cfg.shownURL, kafka)
	_, _ = fmt.Fprintf(w, "run %s, seed %d: %d orders of %d customers (customer_id %d..%d)\n\n",
		r.runID, r.cfg.seed, r.cfg.orders, r.customers, r.base+1, r.base+int64(r.customers))
	const format = "%-16s %8s %9s %6s %15s %5s %8s\n"
	_, _ = fmt.Fprintf(w, format, "", "sent", "distinct", "held", "double effects", "lost", "refused")
	cell := func(n int) string {
		if n < 0 {
			return "-"
		}
		return strconv.Itoa(n)
	}
	for _, row := range r.rows {
		if row.note != "" {
			_, _ = fmt.Fprintf(w, "%-16s %s\n", row.name, row.note)
			continue
		}
		_, _ = fmt.Fprintf(w, format, row.name, cell(row.sent), cell(row.distinct), cell(row.held), cell(row.double), cell(row.lost), cell(row.refused))
	}
	_, _ = fmt.Fprintf(w, "\nsent: HTTP POST attempts incl. retries and duplicates; records produced again to Kafka\n"+
		"distinct: operations (orders, payments), charges and outcomes due, projection counts due, events due\n"+
		"held: what idemd holds, read back through GET /v1/orders, /v1/payments, /v1/customers/{id}/summary and Kafka\n"+
		"refused: operations answered 503 store-unavailable (not executed) on every attempt; not lost, and none may be held\n\n")
	_, _ = fmt.Fprintf(w, "faults: %d responses lost after idemd answered, %d operations sent by %d clients at once with one key, "+
		"%d payments sent again under a new key; %d answers replayed (Idempotent-Replayed)\n",
		r.lostResp, r.dupOps, demoDuplicates, r.newKey, r.replayed)
	if r.cfg.kafka != "" && r.kafka.err == nil {
		_, _ = fmt.Fprintf(w, "kafka: %d records read, those of the run produced again 2-3 times each (%d); both consumer groups read past them\n",
			r.kafka.read, r.kafka.produced)
		if r.dropped != nil {
			_, _ = fmt.Fprintf(w, "inboxes: %s dropped %.0f duplicates, %s %.0f, meanwhile (idemd's /metrics, of the replica answering)\n",
				ProjectionInbox, r.dropped[ProjectionInbox], SagaInbox, r.dropped[SagaInbox])
		}
	}
	if refused := r.refused(); refused != "" {
		_, _ = fmt.Fprintf(w, "refused: %s answered 503 store-unavailable (\"the command was not executed\") on every attempt "+
			"(-attempts %d per request: idemd's database was unavailable for longer): not executed, so not lost\n",
			refused, r.cfg.attempts)
	}
	m, f := r.money, func(d decimal.Decimal) string { return d.StringFixed(orders.AmountScale) }
	_, _ = fmt.Fprintf(w, "money: orders to confirm %s as sent, saga charges %s, summaries' total_amount %s; payments %s as sent, %s held\n",
		f(m.confirmed), f(m.charged), f(m.projected), f(m.paySent), f(m.paid))
	_, _ = fmt.Fprintf(w, "reads: %d GET requests; %s in all\n", r.gets, r.elapsed.Round(100*time.Millisecond))
	if r.ok() {
		_, _ = fmt.Fprintf(w, "OK: no double effects, nothing lost\n")
		return
	}
	_, _ = fmt.Fprintf(w, "FAILED: %d problem(s)\n", len(r.problems))
	for i, p := range r.problems {
		if i == 20 {
			_, _ = fmt.Fprintf(w, "  ... and %d more\n", len(r.problems)-i)
			break
		}
		_, _ = fmt.Fprintf(w, "  %s\n", clipDemo(p, 300))
	}
}

// refused describes the operations refused on every attempt ("2 order
// operations and 1 payment operation"), or "" when none was.
func (r *demoReport) refused() string {
	var parts []string
	plural := func(n int, what string) {
		if n == 1 {
			parts = append(parts, "1 "+what)
		} else if n > 1 {
			parts = append(parts, strconv.Itoa(n)+" "+what+"s")
		}
	}
	for _, row := range r.rows {
		switch row.name {
		case "orders":
			plural(row.refused, "order operation")
		case "payments":
			plural(row.refused, "payment operation")
		}
	}
	plural(r.refusedAgain, "payment re-send under a new key")
	switch len(parts) {
	case 0:
		return ""
	case 1:
		return parts[0]
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}

func clipDemo(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
