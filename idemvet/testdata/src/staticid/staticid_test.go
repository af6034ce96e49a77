package staticid

import (
	"github.com/idemkit/idem/idemkafka"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Tests run one consumer, or fence one on purpose: not reported.
var (
	testConfig = idemkafka.ConsumerConfig[pgx.Tx]{InstanceID: "test-0"}
	testOpt    = kgo.InstanceID(instance)
)
