package producer

import "github.com/twmb/franz-go/pkg/kgo"

// A test's producer writes test records, to a fake broker or one without
// a transaction coordinator, and may turn idempotence off on purpose to
// exercise acks=0: not reported.
func newTestProducer(addr string) (*kgo.Client, error) {
	return kgo.NewClient(kgo.SeedBrokers(addr), kgo.RequiredAcks(kgo.NoAck()), kgo.DisableIdempotentWrite())
}

var testOpts = []kgo.Opt{kgo.DisableIdempotentWrite()}

func newFromOpts() (*kgo.Client, error) { return kgo.NewClient(testOpts...) }
