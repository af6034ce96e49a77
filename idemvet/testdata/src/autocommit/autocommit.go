package autocommit

import (
	"context"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
)

func group() {
	kgo.NewClient(kgo.SeedBrokers("k:9092"), kgo.ConsumeTopics("orders"), kgo.ConsumerGroup("g")) // want "commits polled offsets on a timer"
}

func groupSlice(topic string) {
	opts := []kgo.Opt{kgo.SeedBrokers("k:9092")}
	opts = append(opts, kgo.ConsumeTopics(topic), kgo.ConsumerGroup("g"))
	kgo.NewClient(opts...) // want "add kgo.DisableAutoCommit"
}

var groupOpts = []kgo.Opt{kgo.ConsumerGroup("g")}

func packageLevel() {
	kgo.NewClient(append(groupOpts, kgo.SeedBrokers("k:9092"))...) // want "commits polled offsets"
}

func readMessage(ctx context.Context) {
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{"k:9092"}, GroupID: "g", Topic: "orders"})
	for {
		m, err := r.ReadMessage(ctx) // want "use FetchMessage, then CommitMessages"
		if err != nil {
			return
		}
		_ = m
	}
}

func readMessageConfigVar(ctx context.Context, group string) {
	cfg := kafka.ReaderConfig{Brokers: []string{"k:9092"}, Topic: "orders"}
	cfg.GroupID = group
	r := kafka.NewReader(cfg)
	r.ReadMessage(ctx) // want "kafka-go ReadMessage commits the offset"
}

func readMessagePointer(ctx context.Context) {
	cfg := &kafka.ReaderConfig{GroupID: "g"}
	kafka.NewReader(*cfg).ReadMessage(ctx) // want "ReadMessage commits"
}

// A reader whose config is not seen is reported: it may be a group's.
func readMessageParam(ctx context.Context, r *kafka.Reader) {
	r.ReadMessage(ctx) // want "ReadMessage commits"
}

type consumer struct{ r *kafka.Reader }

func (c *consumer) next(ctx context.Context) (kafka.Message, error) {
	return c.r.ReadMessage(ctx) // want "ReadMessage commits"
}

// Not reported.

func manual(ctx context.Context) {
	cl, _ := kgo.NewClient(kgo.SeedBrokers("k:9092"), kgo.ConsumerGroup("g"), kgo.DisableAutoCommit())
	cl.PollFetches(ctx)
	cl.CommitUncommittedOffsets(ctx)
}

func marks() {
	opts := []kgo.Opt{kgo.ConsumerGroup("g")}
	opts = append(opts, kgo.AutoCommitMarks())
	kgo.NewClient(opts...)
}

func pureProducer() {
	kgo.NewClient(kgo.SeedBrokers("k:9092"))
}

func partitions() {
	// No group: nothing is committed.
	kgo.NewClient(kgo.SeedBrokers("k:9092"), kgo.ConsumeTopics("orders"))
}

// Options from the caller may hold DisableAutoCommit.
func extra(extra []kgo.Opt) {
	kgo.NewClient(append(extra, kgo.ConsumerGroup("g"))...)
}

// settings are loaded at run time: what helperOpts returns is not known.
var settings struct{ Opts []kgo.Opt }

func helperOpts() []kgo.Opt { return settings.Opts }

func fromHelper() {
	kgo.NewClient(append(helperOpts(), kgo.ConsumerGroup("g"))...)
}

func fetch(ctx context.Context) {
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{"k:9092"}, GroupID: "g", Topic: "orders"})
	m, err := r.FetchMessage(ctx)
	if err != nil {
		return
	}
	r.CommitMessages(ctx, m)
}

func partitionReader(ctx context.Context) {
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{"k:9092"}, Topic: "orders", Partition: 0})
	r.ReadMessage(ctx)
}

func emptyGroup(ctx context.Context) {
	cfg := &kafka.ReaderConfig{Topic: "orders", GroupID: ""}
	kafka.NewReader(*cfg).ReadMessage(ctx)
}

// Options from a function of the package are followed.
func groupOptions(group string) ([]kgo.Opt, error) {
	return []kgo.Opt{kgo.SeedBrokers("k:9092"), kgo.ConsumerGroup(group)}, nil
}

func fromOptionsHelper() {
	opts, _ := groupOptions("g")
	kgo.NewClient(opts...) // want "commits polled offsets"
}

// Not reported: the helper's options include its caller's.
func groupWith(extra ...kgo.Opt) []kgo.Opt {
	return append([]kgo.Opt{kgo.ConsumerGroup("g")}, extra...)
}

func fromHelperWithExtra(extra []kgo.Opt) {
	kgo.NewClient(groupWith(extra...)...)
}

func fromHelperManual() {
	kgo.NewClient(groupWith(kgo.DisableAutoCommit())...)
}

// Readers kept in a field, or made by a function of the package, are
// followed to the kafka.NewReader that made them.

type partitionConsumer struct{ r *kafka.Reader }

func newPartitionConsumer(topic string) *partitionConsumer {
	return &partitionConsumer{r: kafka.NewReader(kafka.ReaderConfig{Brokers: []string{"k:9092"}, Topic: topic, Partition: 0})}
}

// Not reported: every reader the field holds reads a partition.
func (c *partitionConsumer) next(ctx context.Context) (kafka.Message, error) {
	return c.r.ReadMessage(ctx)
}

func partitionReaderFor(topic string, partition int) (*kafka.Reader, error) {
	cfg := kafka.ReaderConfig{Brokers: []string{"k:9092"}, Topic: topic, Partition: partition}
	return kafka.NewReader(cfg), nil
}

func readFromHelper(ctx context.Context) {
	r, _ := partitionReaderFor("orders", 0)
	r.ReadMessage(ctx)
}

type groupConsumer struct {
	r   *kafka.Reader
	cfg kafka.ReaderConfig
}

func (c *groupConsumer) start(group string) {
	c.cfg = kafka.ReaderConfig{Brokers: []string{"k:9092"}, Topic: "orders"}
	c.cfg.GroupID = group
	c.r = kafka.NewReader(c.cfg)
}

func (c *groupConsumer) next(ctx context.Context) (kafka.Message, error) {
	return c.r.ReadMessage(ctx) // want "ReadMessage commits"
}

func groupReaderFor(group string) *kafka.Reader {
	if group == "" {
		return kafka.NewReader(kafka.ReaderConfig{Topic: "orders"})
	}
	return kafka.NewReader(kafka.ReaderConfig{Topic: "orders", GroupID: group})
}

func readFromGroupHelper(ctx context.Context) {
	groupReaderFor("g").ReadMessage(ctx) // want "ReadMessage commits"
}

// Exported: another package may put a group's reader in it.
type Source struct{ Reader *kafka.Reader }

func NewSource() *Source {
	return &Source{Reader: kafka.NewReader(kafka.ReaderConfig{Topic: "orders"})}
}

func (s *Source) Next(ctx context.Context) (kafka.Message, error) {
	return s.Reader.ReadMessage(ctx) // want "ReadMessage commits"
}
