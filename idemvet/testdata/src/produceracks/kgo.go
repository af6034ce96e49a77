package produceracks

import "github.com/twmb/franz-go/pkg/kgo"

var leaderAck = kgo.LeaderAck()

var quick = leaderAck

func kgoVar() {
	kgo.NewClient(kgo.SeedBrokers("k:9092"), kgo.RequiredAcks(leaderAck)) // want "acks below all"
}

func kgoChained() {
	kgo.NewClient(kgo.SeedBrokers("k:9092"), kgo.RequiredAcks(quick)) // want "acks below all"
}

// Not reported.

var allISR = kgo.AllISRAcks()

func kgoAll() {
	kgo.NewClient(kgo.SeedBrokers("k:9092"), kgo.RequiredAcks(allISR))
}
