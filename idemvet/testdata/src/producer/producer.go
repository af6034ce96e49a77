package producer

import "github.com/twmb/franz-go/pkg/kgo"

func direct() {
	kgo.NewClient(kgo.SeedBrokers("k:9092"), kgo.DisableIdempotentWrite()) // want "idempotent writes disabled"
}

func leader() {
	kgo.NewClient(kgo.SeedBrokers("k:9092"), kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck())) // want "idempotent writes disabled" "acks below all"
}

func noAck() {
	kgo.NewClient(kgo.RequiredAcks(kgo.NoAck())) // want "acks below all"
}

func slice() {
	opts := []kgo.Opt{
		kgo.SeedBrokers("k:9092"),
		kgo.DisableIdempotentWrite(), // want "idempotent writes disabled"
	}
	kgo.NewClient(opts...)
}

func appended(fast bool) {
	opts := []kgo.Opt{kgo.SeedBrokers("k:9092")}
	if fast {
		opts = append(opts, kgo.RequiredAcks(kgo.LeaderAck())) // want "acks below all"
	}
	kgo.NewClient(opts...)
}

func acksVar() {
	acks := kgo.NoAck()
	kgo.NewClient(kgo.RequiredAcks(acks)) // want "acks below all"
}

func inline() {
	base := []kgo.Opt{kgo.SeedBrokers("k:9092")}
	kgo.NewClient(append(base, kgo.DisableIdempotentWrite())...) // want "idempotent writes disabled"
}

var shared = []kgo.Opt{kgo.DisableIdempotentWrite()} // want "idempotent writes disabled"

func packageLevel() {
	kgo.NewClient(shared...)
}

// Not reported.

func defaults() {
	kgo.NewClient(kgo.SeedBrokers("k:9092"), kgo.ProducerLinger(5))
}

func allAcks() {
	opts := []kgo.Opt{kgo.SeedBrokers("k:9092"), kgo.RequiredAcks(kgo.AllISRAcks())}
	kgo.NewClient(opts...)
}

func unused() {
	// An option never given to NewClient.
	_ = kgo.DisableIdempotentWrite()
}

func consumer() {
	kgo.NewClient(kgo.SeedBrokers("k:9092"), kgo.ConsumeTopics("orders"), kgo.ConsumerGroup("g"), kgo.DisableAutoCommit())
}

// Options from a function of the package are followed.
func unsafeOpts(brokers ...string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.DisableIdempotentWrite(), // want "idempotent writes disabled"
	}
}

func fromHelper() {
	kgo.NewClient(unsafeOpts("k:9092")...)
}

func fastAcks() kgo.Opt { return kgo.RequiredAcks(kgo.LeaderAck()) } // want "acks below all"

func fromOptionHelper() {
	kgo.NewClient(kgo.SeedBrokers("k:9092"), fastAcks())
}
