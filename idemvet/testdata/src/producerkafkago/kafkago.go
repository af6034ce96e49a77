package producerkafkago

import "github.com/segmentio/kafka-go"

func defaults() *kafka.Writer {
	return &kafka.Writer{Addr: "k:9092", Topic: "orders"} // want "kafka-go Writer without RequiredAcks"
}

func leaderOnly() *kafka.Writer {
	return &kafka.Writer{Addr: "k:9092", RequiredAcks: kafka.RequireOne} // want "kafka-go Writer without RequiredAcks"
}

func assigned(w *kafka.Writer) {
	w.RequiredAcks = kafka.RequireNone // want "kafka-go Writer without RequiredAcks"
}

// Not reported.

func all() *kafka.Writer {
	return &kafka.Writer{Addr: "k:9092", RequiredAcks: kafka.RequireAll}
}

// kafka-go's older constructor: NewWriter turns a WriterConfig's
// RequiredAcks 0 (the zero value) into RequireAll; 1 waits for the leader
// only.

func configLeader(brokers []string) *kafka.Writer {
	return kafka.NewWriter(kafka.WriterConfig{Brokers: brokers, Topic: "orders", RequiredAcks: 1}) // want "kafka-go WriterConfig with RequiredAcks 1"
}

func configLeaderConst(brokers []string) *kafka.Writer {
	cfg := kafka.WriterConfig{Brokers: brokers, Topic: "orders", RequiredAcks: int(kafka.RequireOne)} // want "kafka-go WriterConfig with RequiredAcks 1"
	return kafka.NewWriter(cfg)
}

type publisher struct {
	cfg kafka.WriterConfig
	w   *kafka.Writer
}

func (p *publisher) configAssigned(brokers []string) {
	p.cfg = kafka.WriterConfig{Brokers: brokers, Topic: "orders"}
	p.cfg.RequiredAcks = 1 // want "kafka-go WriterConfig with RequiredAcks 1"
	p.w = kafka.NewWriter(p.cfg)
}

func configThenWriter(brokers []string) *kafka.Writer {
	w := kafka.NewWriter(kafka.WriterConfig{Brokers: brokers, Topic: "orders"})
	w.RequiredAcks = kafka.RequireOne // want "kafka-go Writer without RequiredAcks"
	return w
}

// A literal without RequiredAcks given acks below all afterwards: one
// report, at the assignment that decides.
func literalThenLeader() *kafka.Writer {
	w := &kafka.Writer{Addr: "k:9092", Topic: "orders"}
	w.RequiredAcks = kafka.RequireOne // want "kafka-go Writer without RequiredAcks"
	return w
}

// Not reported: NewWriter waits for all replicas unless told otherwise.

func configDefault(brokers []string) *kafka.Writer {
	return kafka.NewWriter(kafka.WriterConfig{Brokers: brokers, Topic: "orders"})
}

func configAll(brokers []string) *kafka.Writer {
	return kafka.NewWriter(kafka.WriterConfig{Brokers: brokers, Topic: "orders", RequiredAcks: -1})
}

func configZero(brokers []string) *kafka.Writer {
	cfg := kafka.WriterConfig{Brokers: brokers, Topic: "orders", RequiredAcks: 0} // 0 is all for NewWriter
	cfg.Async = false
	return kafka.NewWriter(cfg)
}

func configFromCaller(brokers []string, acks int) *kafka.Writer {
	cfg := kafka.WriterConfig{Brokers: brokers, Topic: "orders"}
	cfg.RequiredAcks = acks
	return kafka.NewWriter(cfg)
}

type sink struct {
	w *kafka.Writer
}

func (s *sink) open() {
	s.w = &kafka.Writer{Addr: "k:9092", Topic: "audit"}
	s.w.RequiredAcks = kafka.RequireNone // want "kafka-go Writer without RequiredAcks"
}
