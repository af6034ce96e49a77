package idemkafka_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/inbox"
)

func TestConsumerConfigValidated(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	drv := b.open(t)
	in, err := inbox.New(drv, &inbox.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	valid := func() idemkafka.ConsumerConfig[*sqlTx] {
		return idemkafka.ConsumerConfig[*sqlTx]{
			Seeds:   []string{"127.0.0.1:1"},
			Group:   "g",
			Topics:  []string{"orders"},
			Handler: func(context.Context, *sqlTx, event.Envelope) error { return nil },
		}
	}
	if _, err := idemkafka.NewConsumer(in, new(valid())); err != nil {
		t.Fatalf("NewConsumer with a minimal config: %v", err)
	}
	for name, tc := range map[string]struct {
		edit func(*idemkafka.ConsumerConfig[*sqlTx])
		want string
	}{
		"no seeds":           {func(c *idemkafka.ConsumerConfig[*sqlTx]) { c.Seeds = nil }, "Seeds"},
		"no topics":          {func(c *idemkafka.ConsumerConfig[*sqlTx]) { c.Topics = nil }, "Topics"},
		"empty topic":        {func(c *idemkafka.ConsumerConfig[*sqlTx]) { c.Topics = []string{""} }, "must not be empty"},
		"topic with a space": {func(c *idemkafka.ConsumerConfig[*sqlTx]) { c.Topics = []string{"orders "} }, "only ASCII letters"},
		"topic with a slash": {func(c *idemkafka.ConsumerConfig[*sqlTx]) { c.Topics = []string{"orders/v1"} }, "only ASCII letters"},
		"topic ..":           {func(c *idemkafka.ConsumerConfig[*sqlTx]) { c.Topics = []string{".."} }, "must not be empty"},
		"dead-letter topic too long": {func(c *idemkafka.ConsumerConfig[*sqlTx]) {
			c.Topics = []string{strings.Repeat("t", 247)}
		}, "at most 249"},
		"dead-letter topic with a space": {func(c *idemkafka.ConsumerConfig[*sqlTx]) { c.DeadLetterTopic = "orders dlq" }, "only ASCII letters"},
		"empty seed":                     {func(c *idemkafka.ConsumerConfig[*sqlTx]) { c.Seeds = []string{""} }, "want host:port"},
		"seed without port":              {func(c *idemkafka.ConsumerConfig[*sqlTx]) { c.Seeds = []string{"kafka-1"} }, "want host:port"},
		"seed with a space":              {func(c *idemkafka.ConsumerConfig[*sqlTx]) { c.Seeds = []string{"kafka-1:9092", " kafka-2:9092"} }, "want host:port"},
		"seed with port 0":               {func(c *idemkafka.ConsumerConfig[*sqlTx]) { c.Seeds = []string{"kafka-1:0"} }, "port"},
		"no handler":                     {func(c *idemkafka.ConsumerConfig[*sqlTx]) { c.Handler = nil }, "Handler"},
		"negative poll":                  {func(c *idemkafka.ConsumerConfig[*sqlTx]) { c.MaxPollRecords = -1 }, "MaxPollRecords"},
		"negative attempts":              {func(c *idemkafka.ConsumerConfig[*sqlTx]) { c.Retry.Attempts = -1 }, "Attempts"},
		"consumes its dead letters": {func(c *idemkafka.ConsumerConfig[*sqlTx]) {
			c.Topics = []string{"orders", "orders.dlq"}
		}, `"orders.dlq" of "orders" is also consumed`},
		"dead letters to itself":   {func(c *idemkafka.ConsumerConfig[*sqlTx]) { c.DeadLetterTopic = "orders" }, "also consumed"},
		"instance ID with a space": {func(c *idemkafka.ConsumerConfig[*sqlTx]) { c.InstanceID = "pod 0" }, "InstanceID \"pod 0\": only ASCII letters"},
		"instance ID too long": {func(c *idemkafka.ConsumerConfig[*sqlTx]) {
			c.InstanceID = strings.Repeat("i", 250)
		}, "at most 249"},
		"kgo.InstanceID with a slash": {func(c *idemkafka.ConsumerConfig[*sqlTx]) {
			c.ExtraOpts = []kgo.Opt{kgo.InstanceID("pods/0")}
		}, "kgo.InstanceID \"pods/0\": only ASCII letters"},
		"instance ID with KIP-848": {func(c *idemkafka.ConsumerConfig[*sqlTx]) {
			c.InstanceID = "pod-0"
			c.ExtraOpts = []kgo.Opt{kgo.ServerSideBalancer()}
		}, "KIP-848 static membership is not supported"},
		"two instance IDs": {func(c *idemkafka.ConsumerConfig[*sqlTx]) {
			c.InstanceID = "pod-0"
			c.ExtraOpts = []kgo.Opt{kgo.InstanceID("pod-1")}
		}, "differ"},
	} {
		cfg := valid()
		tc.edit(&cfg)
		if _, err := idemkafka.NewConsumer(in, &cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: NewConsumer = %v; want an error mentioning %q", name, err, tc.want)
		}
	}
	for name, edit := range map[string]func(*idemkafka.ConsumerConfig[*sqlTx]){
		"InstanceID":     func(c *idemkafka.ConsumerConfig[*sqlTx]) { c.InstanceID = "idemd-0.orders_v1" },
		"kgo.InstanceID": func(c *idemkafka.ConsumerConfig[*sqlTx]) { c.ExtraOpts = []kgo.Opt{kgo.InstanceID("idemd-0")} },
		"the same ID twice": func(c *idemkafka.ConsumerConfig[*sqlTx]) {
			c.InstanceID = "idemd-0"
			c.ExtraOpts = []kgo.Opt{kgo.InstanceID("idemd-0")}
		},
	} {
		cfg := valid()
		edit(&cfg)
		if _, err := idemkafka.NewConsumer(in, &cfg); err != nil {
			t.Errorf("NewConsumer with %s: %v", name, err)
		}
	}
	if _, err := idemkafka.NewConsumer(in, nil); err == nil {
		t.Error("NewConsumer with a nil config: no error")
	}
	if _, err := idemkafka.NewConsumer(nil, new(valid())); err == nil {
		t.Error("NewConsumer with a nil inbox: no error")
	}
}

func TestDefaultBackoff(t *testing.T) {
	t.Parallel()
	for n, want := range map[int]time.Duration{
		0: 100 * time.Millisecond, 1: 100 * time.Millisecond, 2: 200 * time.Millisecond,
		5: 1600 * time.Millisecond, 7: 6400 * time.Millisecond, 8: 10 * time.Second, 1000: 10 * time.Second,
	} {
		if got := idemkafka.DefaultBackoff(n); got != want {
			t.Errorf("DefaultBackoff(%d) = %s; want %s", n, got, want)
		}
	}
}

// A CloudEvents header format needs a Source; the zero values keep today's
// behaviour. Construction does no I/O, so the seed is never dialled.
func TestPublisherConfigHeaderFormat(t *testing.T) {
	t.Parallel()
	seeds := []string{"127.0.0.1:1"}
	for name, tc := range map[string]struct {
		format event.HeaderFormat
		source string
		want   string // "" means valid
	}{
		"zero values":                {},
		"idem ignores Source":        {format: event.HeaderFormatIdem, source: "/idem"},
		"cloudevents":                {format: event.HeaderFormatCloudEvents, source: "/idem"},
		"both":                       {format: event.HeaderFormatBoth, source: "https://orders.example.com"},
		"cloudevents without Source": {format: event.HeaderFormatCloudEvents, want: "Source"},
		"both without Source":        {format: event.HeaderFormatBoth, want: "Source"},
		"Source with spaces":         {format: event.HeaderFormatCloudEvents, source: "orders service", want: "URI-reference"},
		"unknown format":             {format: event.HeaderFormat(7), source: "/idem", want: "unknown header format"},
	} {
		p, err := idemkafka.NewPublisher(&idemkafka.PublisherConfig{Seeds: seeds, DefaultTopic: "orders", HeaderFormat: tc.format, Source: tc.source})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: NewPublisher: %v", name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "invalid PublisherConfig")):
			t.Errorf("%s: NewPublisher = %v; want an invalid PublisherConfig error mentioning %q", name, err, tc.want)
		}
		if p != nil {
			p.Close()
		}
	}
}

// A DefaultTopic or a seed a broker would refuse for good is refused at
// start-up: as poison, every key's first event would be parked.
func TestPublisherConfigTopicAndSeeds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		seeds []string
		topic string
		want  string
	}{
		{[]string{"127.0.0.1:1"}, "orders events", "only ASCII letters"},
		{[]string{"127.0.0.1:1"}, strings.Repeat("t", 250), "at most 249"},
		{[]string{""}, "orders", "want host:port"},
		{[]string{"127.0.0.1:1", " "}, "orders", "want host:port"},
		// kgo takes these and dials them for ever: a lookup of " kafka-2"
		// (a list "kafka-1:9092, kafka-2:9092" split on commas), or a port
		// no broker can listen on.
		{[]string{"kafka-1:9092", " kafka-2:9092"}, "orders", "want host:port"},
		{[]string{"kafka-1 :9092"}, "orders", "want host:port"},
		{[]string{"kafka-1:0"}, "orders", "port"},
		{[]string{"kafka-1:65536"}, "orders", "port"},
		{[]string{"kafka-1:-1"}, "orders", "port"},
		{[]string{"kafka-1:ninety"}, "orders", "port"},
	} {
		_, err := idemkafka.NewPublisher(&idemkafka.PublisherConfig{Seeds: tc.seeds, DefaultTopic: tc.topic})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewPublisher(seeds %q, topic %.20q): %v; want an error mentioning %q", tc.seeds, tc.topic, err, tc.want)
		}
	}
	p, err := idemkafka.NewPublisher(&idemkafka.PublisherConfig{Seeds: []string{"127.0.0.1:1", "[::1]:9092", "kafka-2.example.com:65535"}, DefaultTopic: "orders.v1_events-x"})
	if err != nil {
		t.Fatalf("NewPublisher with a valid topic: %v", err)
	}
	p.Close()
}
