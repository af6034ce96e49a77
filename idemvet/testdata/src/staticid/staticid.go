package staticid

import (
	"fmt"
	"os"

	"github.com/idemkit/idem/idemkafka"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

const (
	instance = "billing-consumer"
	prefix   = "billing-"
	empty    = ""
)

func literal() (*kgo.Client, error) {
	return kgo.NewClient(kgo.ConsumerGroup("billing"), kgo.DisableAutoCommit(), kgo.InstanceID("billing-consumer")) // want "consumer group instance ID is a constant"
}

func namedConst() kgo.Opt {
	return kgo.InstanceID(instance) // want "consumer group instance ID is a constant"
}

func constConcat() kgo.Opt {
	return kgo.InstanceID(prefix + "0") // want "consumer group instance ID is a constant"
}

func extraOpts() idemkafka.ConsumerConfig[pgx.Tx] {
	return idemkafka.ConsumerConfig[pgx.Tx]{
		Seeds:     []string{"k:9092"},
		ExtraOpts: []kgo.Opt{kgo.InstanceID(instance)}, // want "consumer group instance ID is a constant"
	}
}

func configLiteral() idemkafka.ConsumerConfig[pgx.Tx] {
	return idemkafka.ConsumerConfig[pgx.Tx]{Seeds: []string{"k:9092"}, InstanceID: "billing-0"} // want "consumer group instance ID is a constant"
}

func configPointer() *idemkafka.ConsumerConfig[pgx.Tx] {
	return &idemkafka.ConsumerConfig[pgx.Tx]{InstanceID: prefix + "0"} // want "consumer group instance ID is a constant"
}

func configUnkeyed() idemkafka.ConsumerConfig[pgx.Tx] {
	return idemkafka.ConsumerConfig[pgx.Tx]{nil, "billing", instance, nil} // want "consumer group instance ID is a constant"
}

func configElided() []idemkafka.ConsumerConfig[pgx.Tx] {
	return []idemkafka.ConsumerConfig[pgx.Tx]{{InstanceID: instance}} // want "consumer group instance ID is a constant"
}

var packageConfig = idemkafka.ConsumerConfig[pgx.Tx]{InstanceID: "billing-0"} // want "consumer group instance ID is a constant"

func assigned() idemkafka.ConsumerConfig[pgx.Tx] {
	var cfg idemkafka.ConsumerConfig[pgx.Tx]
	cfg.InstanceID = instance // want "consumer group instance ID is a constant"
	return cfg
}

// Service embeds the config: its InstanceID is the config's.
type Service struct {
	idemkafka.ConsumerConfig[pgx.Tx]
	Name string
}

func promoted(s *Service) {
	s.InstanceID, s.Name = "billing-0", "billing" // want "consumer group instance ID is a constant"
}

// Not reported.

func fromEnv() kgo.Opt {
	return kgo.InstanceID(os.Getenv("POD_NAME"))
}

func fromHostname() (idemkafka.ConsumerConfig[pgx.Tx], error) {
	host, err := os.Hostname()
	return idemkafka.ConsumerConfig[pgx.Tx]{InstanceID: fmt.Sprintf("billing-%s", host)}, err
}

func fromVariable(id string) idemkafka.ConsumerConfig[pgx.Tx] {
	cfg := idemkafka.ConsumerConfig[pgx.Tx]{InstanceID: id}
	cfg.InstanceID = prefix + id
	return cfg
}

func fromParameter(id string) kgo.Opt {
	return kgo.InstanceID(id)
}

func emptyID() (kgo.Opt, idemkafka.ConsumerConfig[pgx.Tx]) {
	cfg := idemkafka.ConsumerConfig[pgx.Tx]{InstanceID: ""}
	cfg.InstanceID = empty
	return kgo.InstanceID(""), cfg
}

func otherFields() idemkafka.ConsumerConfig[pgx.Tx] {
	return idemkafka.ConsumerConfig[pgx.Tx]{Seeds: []string{"k:9092"}, Group: "billing"}
}

// Other has an InstanceID field of its own: not the consumer's.
type Other struct {
	InstanceID string
}

func otherStruct() Other {
	o := Other{InstanceID: "billing-0"}
	o.InstanceID = instance
	return o
}

// Parcel has an InstanceID beside the embedded config: it shadows the
// config's.
type Parcel struct {
	idemkafka.ConsumerConfig[pgx.Tx]
	InstanceID string
}

func shadowing(p *Parcel) {
	p.InstanceID = "billing-0"
}
