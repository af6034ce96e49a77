// Package kgo is a stub of franz-go's kgo for the idemvet tests.
package kgo

import "context"

type Opt interface{ opt() }

type ProducerOpt interface{ Opt }

type ConsumerOpt interface{ Opt }

type GroupOpt interface{ Opt }

type option struct{}

func (option) opt() {}

type Acks struct{ val int16 }

func NoAck() Acks      { return Acks{0} }
func LeaderAck() Acks  { return Acks{1} }
func AllISRAcks() Acks { return Acks{-1} }

func SeedBrokers(seeds ...string) Opt            { return option{} }
func DisableIdempotentWrite() ProducerOpt        { return option{} }
func RequiredAcks(acks Acks) ProducerOpt         { return option{} }
func ProducerLinger(d int) ProducerOpt           { return option{} }
func ConsumeTopics(topics ...string) ConsumerOpt { return option{} }
func ConsumerGroup(group string) GroupOpt        { return option{} }
func DisableAutoCommit() GroupOpt                { return option{} }
func AutoCommitMarks() GroupOpt                  { return option{} }
func InstanceID(id string) GroupOpt              { return option{} }

type RecordHeader struct {
	Key   string
	Value []byte
}

type Record struct {
	Key, Value []byte
	Headers    []RecordHeader
	Topic      string
}

type FetchPartition struct {
	Partition int32
	Records   []*Record
}

type FetchTopicPartition struct {
	Topic string
	FetchPartition
}

type Fetches []struct{}

func (Fetches) EachRecord(fn func(*Record))                {}
func (Fetches) EachPartition(fn func(FetchTopicPartition)) {}
func (Fetches) Records() []*Record                         { return nil }
func (Fetches) IsClientClosed() bool                       { return false }

type ProduceResults []struct{}

func (ProduceResults) FirstErr() error { return nil }

type Client struct{}

func NewClient(opts ...Opt) (*Client, error) { return &Client{}, nil }

func (*Client) PollFetches(ctx context.Context) Fetches                       { return nil }
func (*Client) PollRecords(ctx context.Context, max int) Fetches              { return nil }
func (*Client) ProduceSync(ctx context.Context, rs ...*Record) ProduceResults { return nil }
func (*Client) CommitUncommittedOffsets(ctx context.Context) error            { return nil }
func (*Client) Close()                                                        {}

func (*Client) CommitRecords(ctx context.Context, rs ...*Record) error { return nil }
func (*Client) MarkCommitRecords(rs ...*Record)                        {}
func (*Client) CommitMarkedOffsets(ctx context.Context) error          { return nil }
