package app_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/app"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestParseConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want app.Config
	}{
		{"defaults", nil, nil, app.Config{Addr: "127.0.0.1:8080", DB: app.Database{Kind: app.SQLite, Path: "./idemd.db"},
			ShutdownTimeout: 15 * time.Second, RequestTimeout: 10 * time.Second, LogFormat: "json", Cleanup: "0 3 * * *", Kafka: app.Kafka{Mode: app.KafkaEmbedded}, KafkaTopic: "idemd.orders",
			KafkaEmbeddedAddr: "127.0.0.1:0", KafkaSessionTimeout: 6 * time.Second, SagaStuckAfter: time.Minute, SagaGiveUpAfter: 15 * time.Minute, KafkaSource: "/idemd"}},
		{"environment", nil, map[string]string{"IDEMD_ADDR": ":9090", "IDEMD_DB": "postgres://u:pw@db:5432/pay",
			"IDEMD_SHUTDOWN_TIMEOUT": "3s", "IDEMD_REQUEST_TIMEOUT": "3s", "IDEMD_LOG_FORMAT": "text", "IDEMD_CLEANUP": "off",
			"IDEMD_KAFKA": "off"},
			app.Config{Addr: ":9090", DB: app.Database{Kind: app.Postgres, URL: "postgres://u:pw@db:5432/pay"},
				ShutdownTimeout: 3 * time.Second, RequestTimeout: 3 * time.Second, LogFormat: "text", Cleanup: "off",
				Kafka: app.Kafka{Mode: app.KafkaOff}, KafkaTopic: "idemd.orders",
				KafkaEmbeddedAddr: "127.0.0.1:0", KafkaSessionTimeout: 6 * time.Second, SagaStuckAfter: time.Minute, SagaGiveUpAfter: 15 * time.Minute, KafkaSource: "/idemd"}},
		{"flags override environment", []string{"-addr", "127.0.0.1:0", "-db", "sqlite:/tmp/x.db", "-shutdown-timeout=1m", "-request-timeout=30s", "-cleanup", "30 4 * * 1-5",
			"-kafka", "kafka-1:9092, 10.0.0.2:9093,[::1]:9094", "-kafka-topic", "orders"},
			map[string]string{"IDEMD_ADDR": ":9090", "IDEMD_DB": "postgres://db/pay", "IDEMD_CLEANUP": "off", "IDEMD_KAFKA": "off"},
			app.Config{Addr: "127.0.0.1:0", DB: app.Database{Kind: app.SQLite, Path: "/tmp/x.db"},
				ShutdownTimeout: time.Minute, RequestTimeout: 30 * time.Second, LogFormat: "json", Cleanup: "30 4 * * 1-5",
				Kafka: app.Kafka{Mode: app.KafkaBrokers, Brokers: "kafka-1:9092,10.0.0.2:9093,[::1]:9094"}, KafkaTopic: "orders",
				KafkaEmbeddedAddr: "127.0.0.1:0", KafkaSessionTimeout: 6 * time.Second, SagaStuckAfter: time.Minute, SagaGiveUpAfter: 15 * time.Minute, KafkaSource: "/idemd"}},
		{"embedded broker", []string{"-kafka-dir", "/var/lib/idemd/kafka", "-kafka-embedded-addr", "0.0.0.0:9092",
			"-saga-stuck-after", "10s", "-saga-give-up-after", "2m"}, nil,
			app.Config{Addr: "127.0.0.1:8080", DB: app.Database{Kind: app.SQLite, Path: "./idemd.db"},
				ShutdownTimeout: 15 * time.Second, RequestTimeout: 10 * time.Second, LogFormat: "json", Cleanup: "0 3 * * *", Kafka: app.Kafka{Mode: app.KafkaEmbedded}, KafkaTopic: "idemd.orders",
				KafkaDir: "/var/lib/idemd/kafka", KafkaEmbeddedAddr: "0.0.0.0:9092", KafkaSessionTimeout: 6 * time.Second, SagaStuckAfter: 10 * time.Second, SagaGiveUpAfter: 2 * time.Minute, KafkaSource: "/idemd"}},
		{"static membership", []string{"-kafka", "k:9092", "-kafka-session-timeout", "45s"}, map[string]string{"IDEMD_KAFKA_INSTANCE_ID": " idemd-2 "},
			app.Config{Addr: "127.0.0.1:8080", DB: app.Database{Kind: app.SQLite, Path: "./idemd.db"},
				ShutdownTimeout: 15 * time.Second, RequestTimeout: 10 * time.Second, LogFormat: "json", Cleanup: "0 3 * * *", Kafka: app.Kafka{Mode: app.KafkaBrokers, Brokers: "k:9092"},
				KafkaTopic: "idemd.orders", KafkaInstanceID: "idemd-2",
				KafkaEmbeddedAddr: "127.0.0.1:0", KafkaSessionTimeout: 45 * time.Second, SagaStuckAfter: time.Minute, SagaGiveUpAfter: 15 * time.Minute, KafkaSource: "/idemd"}},
		{"listen URL", []string{"-db", "postgres://app@pgbouncer:6432/pay?default_query_exec_mode=cache_describe", "-db-listen", "postgres://app@db:5432/pay"}, nil,
			app.Config{Addr: "127.0.0.1:8080", DB: app.Database{Kind: app.Postgres, URL: "postgres://app@pgbouncer:6432/pay?default_query_exec_mode=cache_describe"},
				DBListen:        "postgres://app@db:5432/pay",
				ShutdownTimeout: 15 * time.Second, RequestTimeout: 10 * time.Second, LogFormat: "json", Cleanup: "0 3 * * *", Kafka: app.Kafka{Mode: app.KafkaEmbedded}, KafkaTopic: "idemd.orders",
				KafkaEmbeddedAddr: "127.0.0.1:0", KafkaSessionTimeout: 6 * time.Second, SagaStuckAfter: time.Minute, SagaGiveUpAfter: 15 * time.Minute, KafkaSource: "/idemd"}},
		{"no notify", []string{"-db", "postgres://app@db:5432/pay", "-db-notify=false"}, nil,
			app.Config{Addr: "127.0.0.1:8080", DB: app.Database{Kind: app.Postgres, URL: "postgres://app@db:5432/pay"},
				DBNoNotify:      true,
				ShutdownTimeout: 15 * time.Second, RequestTimeout: 10 * time.Second, LogFormat: "json", Cleanup: "0 3 * * *", Kafka: app.Kafka{Mode: app.KafkaEmbedded}, KafkaTopic: "idemd.orders",
				KafkaEmbeddedAddr: "127.0.0.1:0", KafkaSessionTimeout: 6 * time.Second, SagaStuckAfter: time.Minute, SagaGiveUpAfter: 15 * time.Minute, KafkaSource: "/idemd"}},
		{"notify said", []string{"-db-notify"}, map[string]string{"IDEMD_DB_NOTIFY": "false"},
			app.Config{Addr: "127.0.0.1:8080", DB: app.Database{Kind: app.SQLite, Path: "./idemd.db"},
				ShutdownTimeout: 15 * time.Second, RequestTimeout: 10 * time.Second, LogFormat: "json", Cleanup: "0 3 * * *", Kafka: app.Kafka{Mode: app.KafkaEmbedded}, KafkaTopic: "idemd.orders",
				KafkaEmbeddedAddr: "127.0.0.1:0", KafkaSessionTimeout: 6 * time.Second, SagaStuckAfter: time.Minute, SagaGiveUpAfter: 15 * time.Minute, KafkaSource: "/idemd"}},
		{"embedded broker on another port or address", []string{"-addr", "127.0.0.1:9092", "-kafka-embedded-addr", "127.0.0.2:9092"}, nil,
			app.Config{Addr: "127.0.0.1:9092", DB: app.Database{Kind: app.SQLite, Path: "./idemd.db"},
				ShutdownTimeout: 15 * time.Second, RequestTimeout: 10 * time.Second, LogFormat: "json", Cleanup: "0 3 * * *", Kafka: app.Kafka{Mode: app.KafkaEmbedded}, KafkaTopic: "idemd.orders",
				KafkaEmbeddedAddr: "127.0.0.2:9092", KafkaSessionTimeout: 6 * time.Second, SagaStuckAfter: time.Minute, SagaGiveUpAfter: 15 * time.Minute, KafkaSource: "/idemd"}},
		{"both on port 0", []string{"-addr", ":0", "-kafka-embedded-addr", ":0"}, nil,
			app.Config{Addr: ":0", DB: app.Database{Kind: app.SQLite, Path: "./idemd.db"},
				ShutdownTimeout: 15 * time.Second, RequestTimeout: 10 * time.Second, LogFormat: "json", Cleanup: "0 3 * * *", Kafka: app.Kafka{Mode: app.KafkaEmbedded}, KafkaTopic: "idemd.orders",
				KafkaEmbeddedAddr: ":0", KafkaSessionTimeout: 6 * time.Second, SagaStuckAfter: time.Minute, SagaGiveUpAfter: 15 * time.Minute, KafkaSource: "/idemd"}},
		{"long stuck after without the sweep", []string{"-cleanup", "off", "-saga-stuck-after", "30h", "-saga-give-up-after", "48h"}, nil,
			app.Config{Addr: "127.0.0.1:8080", DB: app.Database{Kind: app.SQLite, Path: "./idemd.db"},
				ShutdownTimeout: 15 * time.Second, RequestTimeout: 10 * time.Second, LogFormat: "json", Cleanup: "off", Kafka: app.Kafka{Mode: app.KafkaEmbedded}, KafkaTopic: "idemd.orders",
				KafkaEmbeddedAddr: "127.0.0.1:0", KafkaSessionTimeout: 6 * time.Second, SagaStuckAfter: 30 * time.Hour, SagaGiveUpAfter: 48 * time.Hour, KafkaSource: "/idemd"}},
		{"admin listener", []string{"-addr", "0.0.0.0:8080"}, map[string]string{"IDEMD_ADMIN_ADDR": " :9090 "},
			app.Config{Addr: "0.0.0.0:8080", AdminAddr: ":9090", DB: app.Database{Kind: app.SQLite, Path: "./idemd.db"},
				ShutdownTimeout: 15 * time.Second, RequestTimeout: 10 * time.Second, LogFormat: "json", Cleanup: "0 3 * * *", Kafka: app.Kafka{Mode: app.KafkaEmbedded}, KafkaTopic: "idemd.orders",
				KafkaEmbeddedAddr: "127.0.0.1:0", KafkaSessionTimeout: 6 * time.Second, SagaStuckAfter: time.Minute, SagaGiveUpAfter: 15 * time.Minute, KafkaSource: "/idemd"}},
		{"admin listener on the same port of another address", []string{"-addr", "10.0.0.5:8080", "-admin-addr", "127.0.0.1:8080"}, nil,
			app.Config{Addr: "10.0.0.5:8080", AdminAddr: "127.0.0.1:8080", DB: app.Database{Kind: app.SQLite, Path: "./idemd.db"},
				ShutdownTimeout: 15 * time.Second, RequestTimeout: 10 * time.Second, LogFormat: "json", Cleanup: "0 3 * * *", Kafka: app.Kafka{Mode: app.KafkaEmbedded}, KafkaTopic: "idemd.orders",
				KafkaEmbeddedAddr: "127.0.0.1:0", KafkaSessionTimeout: 6 * time.Second, SagaStuckAfter: time.Minute, SagaGiveUpAfter: 15 * time.Minute, KafkaSource: "/idemd"}},
		{"cloudevents headers", []string{"-kafka-headers", "CloudEvents"}, map[string]string{"IDEMD_KAFKA_SOURCE": "//shop.example/orders"},
			app.Config{Addr: "127.0.0.1:8080", DB: app.Database{Kind: app.SQLite, Path: "./idemd.db"},
				ShutdownTimeout: 15 * time.Second, RequestTimeout: 10 * time.Second, LogFormat: "json", Cleanup: "0 3 * * *", Kafka: app.Kafka{Mode: app.KafkaEmbedded}, KafkaTopic: "idemd.orders",
				KafkaEmbeddedAddr: "127.0.0.1:0", KafkaSessionTimeout: 6 * time.Second, SagaStuckAfter: time.Minute, SagaGiveUpAfter: 15 * time.Minute,
				KafkaHeaders: event.HeaderFormatCloudEvents, KafkaSource: "//shop.example/orders"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := app.ParseConfig(tt.args, envOf(tt.env))
			if err != nil || got != tt.want {
				t.Errorf("ParseConfig = %+v, %v\nwant %+v", got, err, tt.want)
			}
		})
	}
}

func TestParseConfigErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		mention string
	}{
		{"unknown flag", []string{"-bogus"}, nil, "-bogus"},
		{"positional argument", []string{"serve"}, nil, `"serve"`},
		{"addr without port", []string{"-addr", "localhost"}, nil, "-addr"},
		{"addr port out of range", []string{"-addr", "127.0.0.1:70000"}, nil, "port"},
		{"addr named port", []string{"-addr", "127.0.0.1:http"}, nil, "port"},
		{"bad addr from environment", nil, map[string]string{"IDEMD_ADDR": "nope"}, "IDEMD_ADDR"},
		{"unknown scheme", []string{"-db", "mysql://root@db/pay"}, nil, `"mysql"`},
		{"unknown scheme from environment", nil, map[string]string{"IDEMD_DB": "redis://x"}, "IDEMD_DB"},
		{"listen URL with SQLite", []string{"-db-listen", "postgres://db/pay"}, nil, "-db-listen"},
		{"listen URL not PostgreSQL", []string{"-db", "postgres://db/pay", "-db-listen", "sqlite:x.db"}, nil, "-db-listen"},
		{"bad listen URL", []string{"-db", "postgres://db/pay", "-db-listen", "postgres://db:99999999/pay"}, nil, "-db-listen"},
		{"no notify with SQLite", []string{"-db-notify=false"}, nil, "-db-notify"},
		{"no notify with a listen URL", []string{"-db", "postgres://db/pay", "-db-listen", "postgres://db2/pay", "-db-notify=false"}, nil, "-db-listen"},
		{"bad notify from environment", []string{"-db", "postgres://db/pay"}, map[string]string{"IDEMD_DB_NOTIFY": "sometimes"}, "IDEMD_DB_NOTIFY"},
		{"empty sqlite path", []string{"-db", "sqlite:"}, nil, "empty"},
		{"in-memory sqlite", []string{"-db", ":memory:"}, nil, "in-memory"},
		{"in-memory sqlite URL", []string{"-db", "sqlite::memory:"}, nil, "in-memory"},
		{"empty db", []string{"-db", " "}, nil, "-db"},
		{"query in sqlite path", []string{"-db", "x.db?mode=ro"}, nil, "?"},
		{"libpq keyword DSN", []string{"-db", "host=127.0.0.1 user=postgres password=secret dbname=test"}, nil, "postgres://"},
		{"libpq keyword DSN from environment", nil, map[string]string{"IDEMD_DB": "dbname=pay sslmode=disable"}, "IDEMD_DB"},
		{"bad postgres URL", []string{"-db", "postgres://u:secret@db:notaport/pay"}, nil, "PostgreSQL URL"},
		{"bad postgres URL with a slash in the password", []string{"-db", "postgres://u:secret/1@db/pay"}, nil, "PostgreSQL URL"},
		{"bad postgres URL with an sslpassword", []string{"-db", "postgres://u@db/pay?sslkey=/k.pem&sslpassword=secret"}, nil, "PostgreSQL URL"},
		{"misspelt scheme with a slash in the password", nil, map[string]string{"IDEMD_DB": "postgress://u:secret/1@db/pay"}, `"postgress"`},
		{"zero timeout", []string{"-shutdown-timeout", "0s"}, nil, "-shutdown-timeout"},
		{"bad timeout", []string{"-shutdown-timeout", "soon"}, nil, "-shutdown-timeout"},
		{"zero request timeout", []string{"-request-timeout", "0s"}, nil, "-request-timeout"},
		{"request timeout beyond the commit's room", nil, map[string]string{"IDEMD_REQUEST_TIMEOUT": "31s"}, "IDEMD_REQUEST_TIMEOUT"},
		{"database with a trailing space", []string{"-db", "./idemd.db "}, nil, "trailing spaces"},
		{"bad log format", []string{"-log-format", "xml"}, nil, "-log-format"},
		{"bad cleanup schedule", []string{"-cleanup", "3am daily"}, nil, "-cleanup"},
		{"cleanup schedule with 6 fields", nil, map[string]string{"IDEMD_CLEANUP": "0 0 3 * * *"}, "IDEMD_CLEANUP"},
		{"empty kafka", []string{"-kafka", " "}, nil, "-kafka"},
		{"kafka broker without port", []string{"-kafka", "kafka-1"}, nil, `"kafka-1"`},
		{"kafka broker with a scheme", []string{"-kafka", "kafka://k:9092"}, nil, "-kafka"},
		{"kafka broker port out of range", []string{"-kafka", "k:9092,k:99999"}, nil, `"k:99999"`},
		{"kafka empty broker", []string{"-kafka", "k:9092,"}, nil, "-kafka"},
		{"kafka typo from environment", nil, map[string]string{"IDEMD_KAFKA": "kafka"}, "IDEMD_KAFKA"},
		{"empty topic", []string{"-kafka-topic", ""}, nil, "-kafka-topic"},
		{"topic with a slash", []string{"-kafka-topic", "a/b"}, nil, "-kafka-topic"},
		{"topic dot dot", nil, map[string]string{"IDEMD_KAFKA_TOPIC": ".."}, "IDEMD_KAFKA_TOPIC"},
		{"topic too long", []string{"-kafka-topic", strings.Repeat("t", 246)}, nil, "at most 245"},
		{"kafka dir with a real cluster", []string{"-kafka", "k:9092", "-kafka-dir", "/tmp/k"}, nil, "-kafka-dir is only for -kafka embedded"},
		{"embedded addr from environment with kafka off", []string{"-kafka", "off"}, map[string]string{"IDEMD_KAFKA_EMBEDDED_ADDR": "127.0.0.1:9092"}, "IDEMD_KAFKA_EMBEDDED_ADDR"},
		{"embedded broker on the HTTP port", []string{"-addr", "127.0.0.1:9092", "-kafka-embedded-addr", "127.0.0.1:9092"}, nil,
			"-kafka-embedded-addr (127.0.0.1:9092) and -addr (127.0.0.1:9092) ask for the same port"},
		{"embedded broker on the HTTP port, all interfaces", []string{"-kafka-embedded-addr", ":8080"}, map[string]string{"IDEMD_ADDR": "127.0.0.1:8080"},
			"-kafka-embedded-addr (:8080) and IDEMD_ADDR (127.0.0.1:8080) ask for the same port"},
		{"embedded broker on the HTTP port, IPv4 wildcard", []string{"-addr", "0.0.0.0:8081", "-kafka-embedded-addr", "127.0.0.1:8081"}, nil, "same port"},
		{"bad embedded addr", []string{"-kafka-embedded-addr", "9092"}, nil, "-kafka-embedded-addr"},
		{"bad admin addr", []string{"-admin-addr", "9090"}, nil, `-admin-addr: bad listen address "9090"`},
		{"admin addr port out of range", nil, map[string]string{"IDEMD_ADMIN_ADDR": "127.0.0.1:99999"}, "IDEMD_ADMIN_ADDR: bad listen address"},
		{"admin addr named port", []string{"-admin-addr", "localhost:metrics"}, nil, "-admin-addr"},
		{"admin addr is addr", []string{"-addr", "127.0.0.1:8080", "-admin-addr", "127.0.0.1:8080"}, nil,
			"-admin-addr (127.0.0.1:8080) and -addr (127.0.0.1:8080) ask for the same port"},
		{"admin addr on addr's port, all interfaces", []string{"-admin-addr", ":8080"}, nil,
			"-admin-addr (:8080) and -addr (127.0.0.1:8080) ask for the same port"},
		{"admin addr from environment on addr's port", nil, map[string]string{"IDEMD_ADDR": "0.0.0.0:8080", "IDEMD_ADMIN_ADDR": "127.0.0.1:8080"},
			"IDEMD_ADMIN_ADDR (127.0.0.1:8080) and IDEMD_ADDR (0.0.0.0:8080) ask for the same port"},
		{"admin addr on the embedded broker's port", []string{"-admin-addr", "127.0.0.1:9092", "-kafka-embedded-addr", "127.0.0.1:9092"}, nil,
			"-kafka-embedded-addr (127.0.0.1:9092) and -admin-addr (127.0.0.1:9092) ask for the same port"},
		{"unknown header format", []string{"-kafka-headers", "avro"}, nil, "-kafka-headers"},
		{"session timeout too short", []string{"-kafka-session-timeout", "500ms"}, nil, "-kafka-session-timeout: \"500ms\" is not a duration from 1s to 30m0s"},
		{"session timeout too long", nil, map[string]string{"IDEMD_KAFKA_SESSION_TIMEOUT": "1h"}, "IDEMD_KAFKA_SESSION_TIMEOUT"},
		{"session timeout not a duration", []string{"-kafka-session-timeout", "6"}, nil, "-kafka-session-timeout"},
		{"session timeout with kafka off", []string{"-kafka", "off", "-kafka-session-timeout", "30s"}, nil, "-kafka-session-timeout is for idemd's Kafka consumers"},
		{"instance ID with a slash", []string{"-kafka-instance-id", "pods/idemd-0"}, nil, `-kafka-instance-id: bad Kafka instance ID "pods/idemd-0"`},
		{"instance ID from environment with kafka off", []string{"-kafka", "off"}, map[string]string{"IDEMD_KAFKA_INSTANCE_ID": "idemd-0"}, "IDEMD_KAFKA_INSTANCE_ID is for idemd's Kafka consumers"},
		{"topic with kafka off", []string{"-kafka", "off", "-kafka-topic", "shop.orders"}, nil, "-kafka-topic has no effect with -kafka off: no event is published (the outbox stores no topic"},
		{"topic from environment with kafka off", nil, map[string]string{"IDEMD_KAFKA": "off", "IDEMD_KAFKA_TOPIC": "shop.orders"}, "IDEMD_KAFKA_TOPIC has no effect with -kafka off"},
		{"headers with kafka off", []string{"-kafka", "off", "-kafka-headers", "cloudevents"}, nil, "-kafka-headers has no effect with -kafka off"},
		{"headers from environment with kafka off", []string{"-kafka", "off"}, map[string]string{"IDEMD_KAFKA_HEADERS": "idem"}, "IDEMD_KAFKA_HEADERS has no effect with -kafka off"},
		{"source with kafka off", []string{"-kafka", "off", "-kafka-source", "/shop"}, nil, "-kafka-source has no effect with -kafka off"},
		{"stuck after with kafka off", []string{"-kafka", "off", "-saga-stuck-after", "30s"}, nil, "-saga-stuck-after has no effect with -kafka off: no saga"},
		{"give up after from environment with kafka off", []string{"-kafka", "off"}, map[string]string{"IDEMD_SAGA_GIVE_UP_AFTER": "1h"}, "IDEMD_SAGA_GIVE_UP_AFTER has no effect with -kafka off"},
		{"source with idem headers", []string{"-kafka-source", "/shop"}, nil, "-kafka-source has no effect with -kafka-headers idem"},
		{"source from environment with idem headers", []string{"-kafka", "k:9092"}, map[string]string{"IDEMD_KAFKA_SOURCE": "/shop", "IDEMD_KAFKA_HEADERS": "idem"}, "IDEMD_KAFKA_SOURCE has no effect with IDEMD_KAFKA_HEADERS idem"},
		{"cloudevents without a source", []string{"-kafka-headers", "both", "-kafka-source", ""}, nil, "-kafka-source"},
		{"bad stuck duration", []string{"-saga-stuck-after", "-1s"}, nil, "-saga-stuck-after"},
		{"stuck after outlives the outbox rows", []string{"-saga-stuck-after", "24h", "-saga-give-up-after", "48h"}, nil,
			"-saga-stuck-after (24h0m0s) must be shorter than 24h0m0s"},
		{"give up before stuck", []string{"-saga-stuck-after", "5m", "-saga-give-up-after", "1m"}, nil, "must be longer than -saga-stuck-after"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			mustRefuse(t, tt.args, tt.env, tt.mention)
		})
	}
	if _, err := app.ParseConfig([]string{"-h"}, envOf(nil)); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp", err)
	}
}

func TestParseDatabase(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want app.Database
		str  string
	}{
		{"./idemd.db", app.Database{Kind: app.SQLite, Path: "./idemd.db"}, "sqlite:./idemd.db"},
		{"/var/lib/idemd/pay.db", app.Database{Kind: app.SQLite, Path: "/var/lib/idemd/pay.db"}, "sqlite:/var/lib/idemd/pay.db"},
		{"sqlite:pay.db", app.Database{Kind: app.SQLite, Path: "pay.db"}, "sqlite:pay.db"},
		{"sqlite:///tmp/pay.db", app.Database{Kind: app.SQLite, Path: "/tmp/pay.db"}, "sqlite:/tmp/pay.db"},
		{"postgres://postgres@127.0.0.1:5432/test", app.Database{Kind: app.Postgres, URL: "postgres://postgres@127.0.0.1:5432/test"},
			"postgres://postgres@127.0.0.1:5432/test"},
		{"postgresql://u:secret@db/pay?sslmode=disable", app.Database{Kind: app.Postgres, URL: "postgresql://u:secret@db/pay?sslmode=disable"},
			"postgresql://u:xxxxx@db/pay?sslmode=disable"},
		{"postgres://u@db/pay?password=secret", app.Database{Kind: app.Postgres, URL: "postgres://u@db/pay?password=secret"},
			"postgres://u@db/pay?password=xxxxx"},
	}
	// Printed on the listen line and logged: no password of any kind.
	for _, url := range []string{
		"postgres://u@db/pay?sslmode=verify-full&sslcert=/c.pem&sslkey=/k.pem&sslpassword=secret",
		"postgres://u:secret@db-1:5432,db-2:5432/pay?target_session_attrs=read-write",
		"postgres://u@db-1:5432,db-2:5432/pay?password=secret",
	} {
		if s := (app.Database{Kind: app.Postgres, URL: url}).String(); strings.Contains(s, "secret") || !strings.HasPrefix(s, "postgres://u") {
			t.Errorf("Database{%s}.String() = %s: want the URL, its password hidden", url, s)
		}
	}
	for _, tt := range tests {
		got, err := app.ParseDatabase(tt.in)
		if err != nil || got != tt.want || got.String() != tt.str {
			t.Errorf("ParseDatabase(%q) = %+v (%s), %v; want %+v (%s)", tt.in, got, got, err, tt.want, tt.str)
		}
	}
}

// mustRefuse checks that ParseConfig refuses args and env with a
// ConfigError of one line that mentions mention and shows no password.
func mustRefuse(t *testing.T, args []string, env map[string]string, mention string) {
	t.Helper()
	_, err := app.ParseConfig(args, envOf(env))
	var ce *app.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("err %v, want a ConfigError", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, mention) || strings.Contains(msg, "\n") || strings.Contains(msg, "secret") {
		t.Errorf("message %q: want one line mentioning %q, no password", msg, mention)
	}
}

// The hint for a keyword/value connection string does not tell a service
// that verifies its database's certificate to turn TLS off: the URL it
// suggests keeps the string's parameters, sslmode included.
func TestKeywordDSNHintKeepsTLS(t *testing.T) {
	t.Parallel()
	_, err := app.ParseDatabase("host=db.example user=app password=secret sslmode=verify-full")
	if err == nil || strings.Contains(err.Error(), "sslmode=disable") || strings.Contains(err.Error(), "secret") {
		t.Fatalf("error %v: want a hint that neither turns TLS off nor shows the password", err)
	}
}

// Credentials written into -kafka (user:password@host:port, as in some
// clients' URLs) are refused without being quoted back, by idemd and by
// idemd demo.
func TestKafkaCredentialsNotShown(t *testing.T) {
	t.Parallel()
	const secret = "Zq9SecretPW"
	for _, v := range []string{"u:" + secret + "@kafka-1:9092", "kafka-1:9092,sasl_ssl://u:" + secret + "@kafka-2:9093"} {
		_, err := app.ParseKafka(v)
		if err == nil || strings.Contains(err.Error(), secret) {
			t.Errorf("ParseKafka(%q): %v: want an error without the password", v, err)
		}
		var stdout, stderr bytes.Buffer
		code := app.Run(context.Background(), []string{"demo", "-kafka", v}, func(string) string { return "" }, &stdout, &stderr)
		if out := stdout.String() + stderr.String(); code != 2 || strings.Contains(out, secret) {
			t.Errorf("idemd demo -kafka %q: exit %d, want 2 without the password:\n%s", v, code, out)
		}
	}
}

// A PostgreSQL URL that lost its scheme (//user:password@host/db) is not
// taken for a SQLite file name and printed, password included: it is
// refused without being quoted back.
func TestURLWithoutSchemeNotShown(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"//app:Zq9SecretPW@db:5432/pay", "sqlite://app:Zq9SecretPW@db:5432/pay"} {
		d, err := app.ParseDatabase(v)
		if err == nil || strings.Contains(err.Error(), "Zq9SecretPW") {
			t.Errorf("ParseDatabase(%q) = %v, %v: want an error without the password", v, d, err)
		}
	}
}
