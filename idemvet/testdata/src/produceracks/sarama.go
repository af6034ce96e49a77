package produceracks

import "github.com/IBM/sarama"

const ackLevel = sarama.WaitForLocal

var noResponse = sarama.NoResponse

func saramaConst(cfg *sarama.Config) {
	cfg.Producer.RequiredAcks = ackLevel // want "sarama producer with acks below all"
}

func saramaVar(cfg *sarama.Config) {
	cfg.Producer.RequiredAcks = noResponse // want "sarama producer with acks below all"
}

// Not reported.

var waitAll = sarama.WaitForAll

func saramaAll(cfg *sarama.Config) {
	cfg.Producer.RequiredAcks = waitAll
}

var saramaAcks = sarama.WaitForLocal

func setSaramaAcks(v sarama.RequiredAcks) { saramaAcks = v }

func saramaReassigned(cfg *sarama.Config) {
	cfg.Producer.RequiredAcks = saramaAcks
}
