// Package produceracks gives the producers' acks through package-level
// constants and variables.
package produceracks

import (
	"flag"

	"github.com/segmentio/kafka-go"
)

const leaderOnly = kafka.RequireOne

var noAcks = kafka.RequireNone

var fireAndForget = noAcks // a variable initialised from another

func constAcks() *kafka.Writer {
	return &kafka.Writer{Addr: "k:9092", RequiredAcks: leaderOnly} // want "kafka-go Writer without RequiredAcks"
}

func varAcks() *kafka.Writer {
	return &kafka.Writer{Addr: "k:9092", RequiredAcks: noAcks} // want "kafka-go Writer without RequiredAcks"
}

func chainedVar() *kafka.Writer {
	w := &kafka.Writer{Addr: "k:9092"}
	w.RequiredAcks = fireAndForget // want "kafka-go Writer without RequiredAcks"
	return w
}

var configAcks = 1

func configVar(brokers []string) *kafka.Writer {
	return kafka.NewWriter(kafka.WriterConfig{Brokers: brokers, RequiredAcks: configAcks}) // want "kafka-go WriterConfig with RequiredAcks 1"
}

var convertedAcks = 0

func converted() *kafka.Writer {
	return &kafka.Writer{Addr: "k:9092", RequiredAcks: kafka.RequiredAcks(convertedAcks)} // want "kafka-go Writer without RequiredAcks"
}

// Not reported: all replicas, or a value the program may change.

var allAcks = kafka.RequireAll

func varAll() *kafka.Writer {
	return &kafka.Writer{Addr: "k:9092", RequiredAcks: allAcks}
}

// Reassigned in a function of the package.
var configurable = kafka.RequireOne

func configure(all bool) {
	if all {
		configurable = kafka.RequireAll
	}
}

func reassigned() *kafka.Writer {
	return &kafka.Writer{Addr: "k:9092", RequiredAcks: configurable}
}

// Set by a flag, through its address.
var flagAcks = 1

func init() {
	flag.IntVar(&flagAcks, "acks", 1, "")
}

func fromFlag() *kafka.Writer {
	return &kafka.Writer{Addr: "k:9092", RequiredAcks: kafka.RequiredAcks(flagAcks)}
}

// Set through a pointer method (RequiredAcks.UnmarshalText).
var textAcks = kafka.RequireOne

func parseAcks(s string) error { return textAcks.UnmarshalText([]byte(s)) }

func fromText() *kafka.Writer {
	return &kafka.Writer{Addr: "k:9092", RequiredAcks: textAcks}
}

// Stepped.
var stepped = kafka.RequireNone

func step() { stepped-- }

func fromStepped() *kafka.Writer {
	return &kafka.Writer{Addr: "k:9092", RequiredAcks: stepped}
}

// A local variable: not a package-level one (a parameter may change it).
func local(acks kafka.RequiredAcks) *kafka.Writer {
	a := acks
	return &kafka.Writer{Addr: "k:9092", RequiredAcks: a}
}

// Declared with others from one call.
var splitAcks, splitErr = parse("1")

func parse(s string) (kafka.RequiredAcks, error) { return kafka.RequireAll, nil }

func fromSplit() *kafka.Writer {
	return &kafka.Writer{Addr: "k:9092", RequiredAcks: splitAcks}
}

// Reassigned only in a test: the program runs with its initialiser.
var testedAcks = kafka.RequireOne

func fromTested() *kafka.Writer {
	return &kafka.Writer{Addr: "k:9092", RequiredAcks: testedAcks} // want "kafka-go Writer without RequiredAcks"
}
