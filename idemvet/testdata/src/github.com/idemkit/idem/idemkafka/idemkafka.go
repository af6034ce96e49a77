// Package idemkafka is a stub of idem's idemkafka for the idemvet tests.
package idemkafka

import "github.com/twmb/franz-go/pkg/kgo"

func EventID(r *kgo.Record) ([16]byte, error) { return [16]byte{}, nil }

type ConsumerConfig[TTx any] struct {
	Seeds      []string
	Group      string
	InstanceID string
	ExtraOpts  []kgo.Opt
}
