package idemkafka_test

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/inbox"
)

// listenSeed returns the address of a listener standing in for a broker,
// and a function that reports whether anything connected to it within d.
func listenSeed(t *testing.T) (string, func(d time.Duration) bool) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	dialed := make(chan struct{}, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
			select {
			case dialed <- struct{}{}:
			default:
			}
		}
	}()
	return ln.Addr().String(), func(d time.Duration) bool {
		select {
		case <-dialed:
			return true
		case <-time.After(d):
			return false
		}
	}
}

// NewPublisher refused consumer options (ConsumeTopics) only after it had
// created the client with them: kgo started consuming at once, so the
// refused publisher contacted the brokers (with a ConsumerGroup, it joined
// the consumers' group, a rebalance of every consumer, and left it again).
// NewPublisher and NewConsumer do no I/O, refused or not.
func TestConstructionContactsNoBroker(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	in, err := inbox.New(b.open(t), &inbox.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	for name, opts := range map[string][]kgo.Opt{
		"ConsumeTopics":                   {kgo.ConsumeTopics("orders")},
		"ConsumerGroup and ConsumeTopics": {kgo.ConsumerGroup("billing"), kgo.ConsumeTopics("orders")},
	} {
		t.Run("publisher/"+name, func(t *testing.T) {
			t.Parallel()
			seed, dialed := listenSeed(t)
			p, err := idemkafka.NewPublisher(&idemkafka.PublisherConfig{Seeds: []string{seed}, DefaultTopic: "orders", ExtraOpts: opts})
			if err == nil {
				p.Close()
			}
			if !errors.Is(err, idemkafka.ErrUnsupportedOption) {
				t.Fatalf("NewPublisher = %v; want ErrUnsupportedOption", err)
			}
			if dialed(time.Second) {
				t.Fatal("the refused NewPublisher contacted the broker")
			}
		})
		// The consumer's own topics replace these (see
		// ConsumerConfig.ExtraOpts): accepted, but checked without I/O.
		t.Run("consumer/"+name, func(t *testing.T) {
			t.Parallel()
			seed, dialed := listenSeed(t)
			cfg := consumerConfigAt([]string{seed}, b, "billing", "g", nil, "orders")
			cfg.ExtraOpts = opts
			_, err := idemkafka.NewConsumer(in, &cfg)
			if err != nil {
				t.Fatalf("NewConsumer = %v", err)
			}
			if dialed(time.Second) {
				t.Fatal("NewConsumer contacted the broker")
			}
		})
	}
}
