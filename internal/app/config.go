package app

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/cleanup"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
)

// Defaults of Config.
const (
	DefaultAddr            = "127.0.0.1:8080"
	DefaultDB              = "./idemd.db"
	DefaultShutdownTimeout = 15 * time.Second
	// DefaultRequestTimeout is Config.RequestTimeout's default.
	DefaultRequestTimeout = 10 * time.Second
	// MaxRequestTimeout bounds Config.RequestTimeout: the server's write
	// timeout (60s) must leave the commit its own bound (idemhttp's
	// CommitTimeout, 30s) after it.
	MaxRequestTimeout = 30 * time.Second
	DefaultLogFormat  = "json"
	// DefaultCleanup is the retention sweep's schedule: daily at 03:00
	// local time (the conventional off-peak hour).
	DefaultCleanup = "0 3 * * *"
	// CleanupOff as Config.Cleanup disables the retention sweep (another
	// replica or a job runs it).
	CleanupOff = "off"
	// DefaultKafka is the default -kafka: an in-process broker.
	DefaultKafka = KafkaEmbedded
	// DefaultKafkaTopic is the topic of the order events.
	DefaultKafkaTopic = "idemd.orders"
	// DefaultKafkaEmbeddedAddr is where the embedded broker listens: a
	// free port of the loopback interface.
	DefaultKafkaEmbeddedAddr = "127.0.0.1:0"
	// DefaultPostgresKafkaDir is the embedded broker's log directory with
	// PostgreSQL (with SQLite it is the database file's path + ".kafka").
	DefaultPostgresKafkaDir = "./idemd.kafka"
	// DefaultKafkaSource is the CloudEvents source of idemd's events.
	DefaultKafkaSource = "/idemd"
	// DefaultSagaStuckAfter is how long an order may stay CREATED before
	// its events are published again.
	DefaultSagaStuckAfter = time.Minute
	// DefaultSagaGiveUpAfter is how long an order may stay CREATED before
	// its saga is aborted (not charged yet) or reported to an operator.
	DefaultSagaGiveUpAfter = 15 * time.Minute
	// WatchdogRedriveFor is how long after an order's creation the
	// watchdog publishes its events again (orders.WatchdogConfig.RedriveFor)
	// while the retention sweep runs: the inboxes forget an event
	// cleanup.DefaultInboxTTL (72h) after they applied it, and a copy
	// read after that would be applied again (the projection would count
	// the order twice); the last 24h are for a consumer reading the last
	// copy late. With -cleanup off the inboxes forget nothing, and the
	// watchdog publishes them again for as long as the order is stuck.
	WatchdogRedriveFor = cleanup.DefaultInboxTTL - 24*time.Hour
	// EnvOTel is the environment variable of -otel.
	EnvOTel = "IDEMD_OTEL"
	// EnvOTLPEndpoint is OpenTelemetry's OTLP endpoint variable: set, it
	// turns -otel on.
	EnvOTLPEndpoint = "OTEL_EXPORTER_OTLP_ENDPOINT"
	// EnvOTLPTracesEndpoint is OpenTelemetry's OTLP endpoint variable for
	// traces: set, it turns -otel on too.
	EnvOTLPTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
)

// Config is idemd's configuration.
type Config struct {
	// Addr is the TCP address to listen on. Defaults to 127.0.0.1:8080.
	Addr string
	// AdminAddr, when set, is a second TCP address, for Prometheus and
	// the probes: Run serves /metrics there, and no longer on Addr (which
	// a public ingress may route), and /healthz and /livez on both (a
	// load balancer probes the port it sends traffic to). Empty (the
	// default): everything on Addr.
	AdminAddr string
	// DB is the database. Defaults to the SQLite file ./idemd.db.
	DB Database
	// DBListen is the PostgreSQL URL the outbox relay LISTENs on for
	// other replicas' events. Defaults to "": DB's. For a DB that goes
	// through a pooler in transaction mode (PgBouncer), which passes no
	// notification on between transactions: a direct connection.
	DBListen string
	// DBNoNotify makes the orders' transactions enqueue their events
	// without pg_notify (pgdriver.Config.NoOutboxNotify): PostgreSQL
	// commits notifying transactions one at a time, server-wide, and the
	// relays then poll every second instead. PostgreSQL only, and not
	// with DBListen. Defaults to false (-db-notify, true: notify).
	DBNoNotify bool
	// ShutdownTimeout bounds the whole shutdown (see Serve). Defaults to
	// 15s.
	ShutdownTimeout time.Duration
	// RequestTimeout bounds the work of each /v1 request (its context's
	// deadline): a request that waits for a connection of an exhausted
	// pool, or for a lock of a stalled database, answers 503
	// store-unavailable with Retry-After when it passes, its writes
	// rolled back, instead of waiting for as long as its client does.
	// Defaults to DefaultRequestTimeout; at most MaxRequestTimeout.
	RequestTimeout time.Duration
	// LogFormat is "json" (the default) or "text".
	LogFormat string
	// Cleanup is the cron schedule (5 fields) of the retention sweep that
	// deletes expired idempotency records and old inbox and outbox rows
	// (package cleanup), or CleanupOff. Defaults to DefaultCleanup. With
	// several replicas on one database, one sweeps and the others skip.
	Cleanup string
	// Kafka is the Kafka cluster of the order events. Defaults to
	// KafkaEmbedded.
	Kafka Kafka
	// KafkaAuth is how idemd connects to a real cluster (KafkaBrokers):
	// TLS and SASL. The zero value is plaintext without authentication.
	KafkaAuth KafkaAuth
	// KafkaTopic is the topic of the order events. Defaults to
	// DefaultKafkaTopic.
	KafkaTopic string
	// KafkaDir is the embedded broker's log directory (KafkaEmbedded).
	// Empty means DB.Path+".kafka" with SQLite and
	// DefaultPostgresKafkaDir with PostgreSQL.
	KafkaDir string
	// KafkaEmbeddedAddr is the embedded broker's listen address.
	// Defaults to DefaultKafkaEmbeddedAddr (a free port).
	KafkaEmbeddedAddr string
	// KafkaInstanceID turns on static group membership for idemd's
	// consumers (idemkafka.ConsumerConfig.InstanceID): this replica's
	// stable ID, different for every replica (a StatefulSet pod's name).
	// A restarted replica takes its partitions back at once; a stopped
	// one keeps them, unconsumed, until it returns or its session
	// (KafkaSessionTimeout) expires. Empty: dynamic membership.
	KafkaInstanceID string
	// KafkaSessionTimeout is the consumers' group session timeout: how
	// long a replica that died (or, a static member, stopped) keeps its
	// partitions. Defaults to ConsumerSessionTimeout; 1s to 30m, and
	// within the brokers' group.min/max.session.timeout.ms.
	KafkaSessionTimeout time.Duration
	// KafkaHeaders is how event records carry the envelope: idem's own
	// headers (the default), the CloudEvents Kafka binding's ce_* headers,
	// or both. Consumers read all three.
	KafkaHeaders event.HeaderFormat
	// KafkaSource is the CloudEvents source (ce_source) of the events, a
	// URI-reference. Defaults to DefaultKafkaSource.
	KafkaSource string
	// SagaStuckAfter is how long an order may stay CREATED before idemd
	// publishes its events again from the outbox. Defaults to
	// DefaultSagaStuckAfter.
	SagaStuckAfter time.Duration
	// SagaGiveUpAfter is how long an order may stay CREATED before idemd
	// aborts its saga (when nothing was charged: the order is REJECTED)
	// or reports it to an operator (when it was). Defaults to
	// DefaultSagaGiveUpAfter; it must exceed SagaStuckAfter.
	SagaGiveUpAfter time.Duration
	// OTel turns on OpenTelemetry traces and metrics (-otel, IDEMD_OTEL):
	// exported over OTLP/HTTP to OTEL_EXPORTER_OTLP_ENDPOINT, whose being
	// set (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT's) turns it on too unless
	// -otel=false or IDEMD_OTEL=false says otherwise. The program that runs idemd provides the exporter
	// (Options.Telemetry); off by default.
	OTel bool
}

// EmbeddedKafkaDir returns the embedded broker's log directory: KafkaDir, or
// its default for the database.
func (c Config) EmbeddedKafkaDir() string {
	switch {
	case c.KafkaDir != "":
		return c.KafkaDir
	case c.DB.Kind == SQLite:
		return c.DB.Path + ".kafka"
	}
	return DefaultPostgresKafkaDir
}

// ConfigError is a configuration mistake: idemd exits with code 2.
type ConfigError struct{ msg string }

func (e *ConfigError) Error() string { return e.msg }

func configErrorf(format string, args ...any) error {
	return &ConfigError{msg: fmt.Sprintf(format, args...)}
}

// setting is one configuration value, settable by flag and environment.
type setting struct {
	flag, env, def, usage string
}

var settings = []setting{
	{"addr", "IDEMD_ADDR", DefaultAddr, "listen address host:port (port 0 picks a free port)"},
	{"admin-addr", "IDEMD_ADMIN_ADDR", "", "listen address host:port of /metrics, /healthz and /livez for Prometheus and the probes, a port the public ingress never routes; /metrics then leaves -addr, the probes stay on both (default: none, everything on -addr)"},
	{"db", "IDEMD_DB", DefaultDB, "database: postgres://user:pass@host/db, sqlite:PATH or a file path"},
	{"db-password-file", "IDEMD_DB_PASSWORD_FILE", "", "file holding the PostgreSQL password (one line), read again for every new connection: a password rotated in the file is used without a restart; -db and -db-listen then carry none"},
	{"db-listen", "IDEMD_DB_LISTEN", "", "PostgreSQL URL the outbox relay LISTENs on for other replicas' events (default: -db's); a direct one when -db goes through a pooler in transaction mode (PgBouncer)"},
	{"db-notify", "IDEMD_DB_NOTIFY", "true", "false: orders enqueue their events without pg_notify, and the relays poll every second: PostgreSQL commits the transactions that notify one at a time, server-wide, which caps the orders per second of a busy database (PostgreSQL only; not with -db-listen)"},
	{"shutdown-timeout", "IDEMD_SHUTDOWN_TIMEOUT", DefaultShutdownTimeout.String(), "bound of the whole shutdown: requests in flight, the relay, the consumers and the last outbox flush"},
	{"request-timeout", "IDEMD_REQUEST_TIMEOUT", DefaultRequestTimeout.String(), "bound of each /v1 request's work: a request still waiting for the database (a connection of an exhausted pool, a lock) then answers 503 with Retry-After; at most " + MaxRequestTimeout.String()},
	{"log-format", "IDEMD_LOG_FORMAT", DefaultLogFormat, "log format: json or text"},
	{"cleanup", "IDEMD_CLEANUP", DefaultCleanup, "cron schedule of the retention sweep (minute hour day month weekday), or off"},
	{"kafka", "IDEMD_KAFKA", DefaultKafka, "Kafka for the order events: embedded (in-process broker, one replica per database), off (events stay in the outbox), or seed brokers host:port,host:port"},
	{"kafka-tls", "IDEMD_KAFKA_TLS", "false", "TLS (1.2 or later) to the Kafka brokers, with the system's CA certificates"},
	{"kafka-tls-ca", "IDEMD_KAFKA_TLS_CA", "", "PEM file of the CA certificates the brokers' certificates must chain to, instead of the system's (implies -kafka-tls)"},
	{"kafka-tls-cert", "IDEMD_KAFKA_TLS_CERT", "", "PEM file of a client certificate, for mutual TLS (with -kafka-tls-key; implies -kafka-tls)"},
	{"kafka-tls-key", "IDEMD_KAFKA_TLS_KEY", "", "PEM file of the client certificate's key (with -kafka-tls-cert)"},
	{"kafka-tls-server-name", "IDEMD_KAFKA_TLS_SERVER_NAME", "", "name the brokers' certificates must carry (default: each broker's host; implies -kafka-tls)"},
	{"kafka-sasl", "IDEMD_KAFKA_SASL", "", "SASL mechanism of the Kafka brokers: plain, scram-sha-256 or scram-sha-512 (default: none)"},
	{"kafka-sasl-user", "IDEMD_KAFKA_SASL_USER", "", "SASL user name (with -kafka-sasl)"},
	{"kafka-sasl-password-file", "IDEMD_KAFKA_SASL_PASSWORD_FILE", "", "file holding the SASL password (one line), unless " + EnvKafkaSASLPassword + " holds it; there is no flag for the password itself"},
	{"kafka-topic", "IDEMD_KAFKA_TOPIC", DefaultKafkaTopic, "Kafka topic of the order events (dead letters go to TOPIC.dlq); not with -kafka off"},
	{"kafka-dir", "IDEMD_KAFKA_DIR", "", "embedded broker's log directory (default: the SQLite file's path + .kafka, or " + DefaultPostgresKafkaDir + " with PostgreSQL)"},
	{"kafka-embedded-addr", "IDEMD_KAFKA_EMBEDDED_ADDR", DefaultKafkaEmbeddedAddr, "embedded broker's listen address host:port (port 0 picks a free port; not -addr's or -admin-addr's)"},
	{"kafka-instance-id", "IDEMD_KAFKA_INSTANCE_ID", "", "static consumer group membership: this replica's own stable ID (e.g. its StatefulSet pod name; never shared by two replicas). A restarted replica gets its partitions back at once; a stopped one holds them for up to -kafka-session-timeout (default: dynamic membership)"},
	{"kafka-session-timeout", "IDEMD_KAFKA_SESSION_TIMEOUT", ConsumerSessionTimeout.String(), "consumer group session timeout: how long a replica that died (or, with -kafka-instance-id, stopped) keeps its partitions; 1s to 30m, within the brokers' group.min/max.session.timeout.ms (Kafka: 6s to 30m by default)"},
	{"kafka-headers", "IDEMD_KAFKA_HEADERS", "idem", "headers of event records: idem, cloudevents (the CloudEvents Kafka binding's ce_* headers) or both; not with -kafka off"},
	{"kafka-source", "IDEMD_KAFKA_SOURCE", DefaultKafkaSource, "CloudEvents source (ce_source) of the events, a URI-reference (with -kafka-headers cloudevents or both)"},
	{"saga-stuck-after", "IDEMD_SAGA_STUCK_AFTER", DefaultSagaStuckAfter.String(), "an order still CREATED after this long gets its events published again (under 24h unless -cleanup is off); not with -kafka off"},
	{"saga-give-up-after", "IDEMD_SAGA_GIVE_UP_AFTER", DefaultSagaGiveUpAfter.String(), "an order still CREATED after this long is rejected if nothing was charged, else reported to an operator; not with -kafka off"},
}

// boolSettings are the settings that are switches: -name alone means
// -name=true.
var boolSettings = map[string]bool{"kafka-tls": true, "db-notify": true}

// boolString is a switch's flag.Value: it keeps the text, checked after
// parsing like the other settings'.
type boolString struct{ v *string }

func (b boolString) String() string {
	if b.v == nil {
		return ""
	}
	return *b.v
}
func (b boolString) Set(s string) error { *b.v = s; return nil }
func (b boolString) IsBoolFlag() bool   { return true }

// registerSettings defines the flags of list on fs, with their
// environment variables as defaults, and returns their values by name.
func registerSettings(fs *flag.FlagSet, list []setting, getenv func(string) string) map[string]*string {
	values := make(map[string]*string, len(list))
	for _, s := range list {
		def := s.def
		if v := getenv(s.env); v != "" {
			def = v
		}
		if boolSettings[s.flag] {
			v := def
			values[s.flag] = &v
			fs.Var(boolString{&v}, s.flag, s.usage)
			continue
		}
		values[s.flag] = fs.String(s.flag, def, s.usage)
	}
	return values
}

// settingsNamed returns the settings of names.
func settingsNamed(names []string) []setting {
	var list []setting
	for _, s := range settings {
		for _, n := range names {
			if s.flag == n {
				list = append(list, s)
			}
		}
	}
	return list
}

// Usage describes the flags and environment variables.
func Usage() string {
	var b strings.Builder
	b.WriteString("usage: idemd [flags]\n\nFlags override the environment variable named after each one. Another IDEMD_\n" +
		"variable in the environment stops idemd and its subcommands (exit 2).\n\n")
	for _, s := range settings {
		fmt.Fprintf(&b, "  -%s (%s, default %q)\n    \t%s\n", s.flag, s.env, s.def, s.usage)
	}
	fmt.Fprintf(&b, "  %s (environment only)\n    \t%s\n", EnvKafkaSASLPassword,
		"SASL password (or -kafka-sasl-password-file); never a flag, whose value would show in ps")
	fmt.Fprintf(&b, "  -otel (%s, default false; on when %s or %s is set)\n    \t%s\n", EnvOTel, EnvOTLPEndpoint, EnvOTLPTracesEndpoint,
		"export traces and metrics with OpenTelemetry over OTLP/HTTP (OTEL_* variables); never blocks start-up")
	b.WriteString("\nSubcommands (run one with -h for its help):\n\n" +
		"  idemd outbox redrive (-since DURATION | -all) [-key K1,K2] [-db DATABASE]\n" +
		"  idemd outbox unpark (-event ID1,ID2 | -key K1,K2 | -all) [-db DATABASE]\n" +
		"  idemd migrate up|status|sql [-db DATABASE]\n" +
		"  idemd demo [-url URL] [-kafka HOST:PORT] [-orders N] [-seed N]\n")
	return b.String()
}

// ParseConfig reads the configuration from the environment (getenv) and the
// command-line arguments, which take precedence. It returns flag.ErrHelp for
// -h, and a *ConfigError for anything invalid.
func ParseConfig(args []string, getenv func(string) string) (Config, error) {
	fs := flag.NewFlagSet("idemd", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // Run prints one line, not the flag package's usage
	values := registerSettings(fs, settings, getenv)
	otelEnv, otelEnvErr := strconv.ParseBool(strings.TrimSpace(getenv(EnvOTel)))
	otelFlag := fs.Bool("otel", otelEnv, "export traces and metrics with OpenTelemetry")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return Config{}, err
		}
		return Config{}, configErrorf("%v (run idemd -h for help)", err)
	}
	if fs.NArg() > 0 {
		return Config{}, configErrorf("unexpected argument %q (run idemd -h for help)", fs.Arg(0))
	}
	// source names where a value came from, for error messages.
	source := func(name string) string {
		set := false
		fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
		for _, s := range settings {
			if s.flag == name && !set && getenv(s.env) != "" {
				return s.env
			}
		}
		return "-" + name
	}

	given := func(name string) bool { return source(name) != "-"+name || isSet(fs, name) }
	cfg := Config{Addr: *values["addr"], LogFormat: *values["log-format"], Cleanup: strings.TrimSpace(*values["cleanup"])}
	switch {
	case isSet(fs, "otel"):
		cfg.OTel = *otelFlag
	case strings.TrimSpace(getenv(EnvOTel)) != "":
		if otelEnvErr != nil {
			return Config{}, configErrorf("%s: %q is not true or false", EnvOTel, getenv(EnvOTel))
		}
		cfg.OTel = otelEnv
	default:
		cfg.OTel = getenv(EnvOTLPEndpoint) != "" || getenv(EnvOTLPTracesEndpoint) != ""
	}
	if err := checkAddr(cfg.Addr); err != nil {
		return Config{}, configErrorf("%s: %v", source("addr"), err)
	}
	if cfg.AdminAddr = strings.TrimSpace(*values["admin-addr"]); cfg.AdminAddr != "" {
		if err := checkAddr(cfg.AdminAddr); err != nil {
			return Config{}, configErrorf("%s: %v", source("admin-addr"), err)
		}
		if samePort(cfg.Addr, cfg.AdminAddr) {
			return Config{}, configErrorf("%s (%s) and %s (%s) ask for the same port: the admin endpoints need a port of their own, which the public ingress does not route",
				source("admin-addr"), cfg.AdminAddr, source("addr"), cfg.Addr)
		}
	}
	db, err := ParseDatabase(*values["db"])
	if err != nil {
		return Config{}, configErrorf("%s: %v", source("db"), err)
	}
	if f := strings.TrimSpace(*values["db-password-file"]); f != "" {
		if db, err = db.withPasswordFile(f); err != nil {
			return Config{}, configErrorf("%s: %v", source("db-password-file"), err)
		}
	}
	cfg.DB = db
	if l := *values["db-listen"]; l != "" {
		ldb, err := ParseDatabase(l)
		switch {
		case err != nil:
			return Config{}, configErrorf("%s: %v", source("db-listen"), err)
		case ldb.Kind != Postgres:
			return Config{}, configErrorf("%s: not a postgres:// URL", source("db-listen"))
		case db.Kind != Postgres:
			return Config{}, configErrorf("%s: only with a PostgreSQL -db (SQLite has no LISTEN)", source("db-listen"))
		case db.PasswordFile != "" && urlPasswordRe.MatchString(l):
			return Config{}, configErrorf("%s: the PostgreSQL password is given twice: in the URL and by %s (the file's is read for every connection, the listener's too); drop it from the URL",
				source("db-listen"), source("db-password-file"))
		}
		cfg.DBListen = l
	}
	if v := strings.TrimSpace(*values["db-notify"]); v != "" {
		notify, err := strconv.ParseBool(v)
		switch {
		case err != nil:
			return Config{}, configErrorf("%s: %q is not true or false", source("db-notify"), v)
		case notify:
		case db.Kind != Postgres:
			return Config{}, configErrorf("%s=false: only with a PostgreSQL -db (SQLite has no NOTIFY)", source("db-notify"))
		case cfg.DBListen != "":
			return Config{}, configErrorf("%s=false and %s: the relay would LISTEN for notifications no transaction sends; drop one of them",
				source("db-notify"), source("db-listen"))
		default:
			cfg.DBNoNotify = true
		}
	}
	d, err := time.ParseDuration(*values["shutdown-timeout"])
	if err != nil || d <= 0 {
		return Config{}, configErrorf("%s: %q is not a positive duration like 15s", source("shutdown-timeout"), *values["shutdown-timeout"])
	}
	cfg.ShutdownTimeout = d
	d, err = time.ParseDuration(*values["request-timeout"])
	if err != nil || d <= 0 || d > MaxRequestTimeout {
		return Config{}, configErrorf("%s: %q is not a positive duration of at most %s like 10s", source("request-timeout"), *values["request-timeout"], MaxRequestTimeout)
	}
	cfg.RequestTimeout = d
	if cfg.LogFormat != "json" && cfg.LogFormat != "text" {
		return Config{}, configErrorf("%s: %q is not json or text", source("log-format"), cfg.LogFormat)
	}
	if err := cleanup.CheckSchedule(cfg.Cleanup); cfg.Cleanup != CleanupOff && err != nil {
		return Config{}, configErrorf("%s: %v", source("cleanup"), err)
	}
	if cfg.Kafka, err = ParseKafka(*values["kafka"]); err != nil {
		return Config{}, configErrorf("%s: %v", source("kafka"), err)
	}
	cfg.KafkaTopic = *values["kafka-topic"]
	if err := CheckTopic(cfg.KafkaTopic); err != nil {
		return Config{}, configErrorf("%s: %v", source("kafka-topic"), err)
	}
	cfg.KafkaDir = strings.TrimSpace(*values["kafka-dir"])
	cfg.KafkaEmbeddedAddr = strings.TrimSpace(*values["kafka-embedded-addr"])
	if err := checkAddr(cfg.KafkaEmbeddedAddr); err != nil {
		return Config{}, configErrorf("%s: %v", source("kafka-embedded-addr"), err)
	}
	if cfg.KafkaInstanceID = strings.TrimSpace(*values["kafka-instance-id"]); cfg.KafkaInstanceID != "" {
		if cfg.Kafka.Mode == KafkaOff {
			return Config{}, configErrorf("%s is for idemd's Kafka consumers (-kafka is off: there are none)", source("kafka-instance-id"))
		}
		if err := idemkafka.CheckInstanceID(cfg.KafkaInstanceID); err != nil {
			return Config{}, configErrorf("%s: bad Kafka %v", source("kafka-instance-id"), err)
		}
	}
	if cfg.KafkaSessionTimeout, err = time.ParseDuration(strings.TrimSpace(*values["kafka-session-timeout"])); err != nil ||
		cfg.KafkaSessionTimeout < MinSessionTimeout || cfg.KafkaSessionTimeout > MaxSessionTimeout {
		return Config{}, configErrorf("%s: %q is not a duration from %v to %v", source("kafka-session-timeout"), *values["kafka-session-timeout"], MinSessionTimeout, MaxSessionTimeout)
	}
	if cfg.Kafka.Mode == KafkaOff && given("kafka-session-timeout") {
		return Config{}, configErrorf("%s is for idemd's Kafka consumers (-kafka is off: there are none)", source("kafka-session-timeout"))
	}
	if cfg.KafkaHeaders, err = event.ParseHeaderFormat(strings.TrimSpace(*values["kafka-headers"])); err != nil {
		return Config{}, configErrorf("%s: %v", source("kafka-headers"), err)
	}
	cfg.KafkaSource = strings.TrimSpace(*values["kafka-source"])
	if err := (event.HeaderOptions{Format: cfg.KafkaHeaders, Source: cfg.KafkaSource}).Validate(); err != nil {
		return Config{}, configErrorf("%s: %v", source("kafka-source"), err)
	}
	if cfg.Kafka.Mode == KafkaEmbedded {
		for _, l := range [][2]string{{"addr", cfg.Addr}, {"admin-addr", cfg.AdminAddr}} {
			if l[1] != "" && samePort(l[1], cfg.KafkaEmbeddedAddr) {
				return Config{}, configErrorf("%s (%s) and %s (%s) ask for the same port: the embedded broker could not listen once the HTTP server does",
					source("kafka-embedded-addr"), cfg.KafkaEmbeddedAddr, source(l[0]), l[1])
			}
		}
	}
	if cfg.Kafka.Mode == KafkaOff {
		// The outbox stores no topic and no header format: a later start
		// with Kafka publishes what waits there with its own.
		for _, name := range []string{"kafka-topic", "kafka-headers", "kafka-source"} {
			if given(name) {
				return Config{}, configErrorf("%s has no effect with -kafka off: no event is published (the outbox stores no topic or headers; "+
					"the relay of a later start with Kafka publishes them with its own)", source(name))
			}
		}
		for _, name := range []string{"saga-stuck-after", "saga-give-up-after"} {
			if given(name) {
				return Config{}, configErrorf("%s has no effect with -kafka off: no saga and no stuck order watchdog run", source(name))
			}
		}
	} else if cfg.KafkaHeaders == event.HeaderFormatIdem && given("kafka-source") {
		return Config{}, configErrorf("%s has no effect with %s %s: it is the CloudEvents ce_source, written only with -kafka-headers cloudevents or both",
			source("kafka-source"), source("kafka-headers"), cfg.KafkaHeaders)
	}
	if cfg.Kafka.Mode != KafkaEmbedded {
		for _, name := range []string{"kafka-dir", "kafka-embedded-addr"} {
			if given(name) {
				return Config{}, configErrorf("%s is only for -kafka embedded (-kafka is %s)", source(name), cfg.Kafka)
			}
		}
	}
	if cfg.Kafka.Mode != KafkaBrokers {
		if src := kafkaAuthGiven(given, source, getenv); src != "" {
			why := "the embedded broker listens in plaintext, without authentication"
			if cfg.Kafka.Mode == KafkaOff {
				why = "idemd does not connect to Kafka"
			}
			return Config{}, configErrorf("%s is only for a Kafka cluster given by its seed brokers (-kafka is %s: %s)", src, cfg.Kafka, why)
		}
	} else if cfg.KafkaAuth, err = parseKafkaAuth(func(name string) string { return *values[name] }, given, source, getenv); err != nil {
		return Config{}, configErrorf("%v", err)
	}
	for _, d := range []struct {
		name string
		to   *time.Duration
	}{{"saga-stuck-after", &cfg.SagaStuckAfter}, {"saga-give-up-after", &cfg.SagaGiveUpAfter}} {
		v, err := time.ParseDuration(*values[d.name])
		if err != nil || v <= 0 {
			return Config{}, configErrorf("%s: %q is not a positive duration like 1m", source(d.name), *values[d.name])
		}
		*d.to = v
	}
	if cfg.SagaGiveUpAfter <= cfg.SagaStuckAfter {
		return Config{}, configErrorf("%s (%s) must be longer than %s (%s)", source("saga-give-up-after"), cfg.SagaGiveUpAfter,
			source("saga-stuck-after"), cfg.SagaStuckAfter)
	}
	if cfg.Cleanup != CleanupOff && cfg.SagaStuckAfter >= cleanup.DefaultOutboxTTL {
		return Config{}, configErrorf("%s (%s) must be shorter than %s, how long the retention sweep (%s) keeps a published event in the outbox: "+
			"the watchdog would find no event left to publish again", source("saga-stuck-after"), cfg.SagaStuckAfter, cleanup.DefaultOutboxTTL, source("cleanup"))
	}
	return cfg, nil
}

// isSet reports whether flag name was given on the command line.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// samePort reports whether listening on both a and b (checked by
// checkAddr) must fail: one port, not 0, on one host or where one of them
// listens on every interface ("", "::", or "0.0.0.0" with an IPv4 host or
// a name).
func samePort(a, b string) bool {
	ha, pa, _ := net.SplitHostPort(a)
	hb, pb, _ := net.SplitHostPort(b)
	na, _ := strconv.ParseUint(pa, 10, 16)
	nb, _ := strconv.ParseUint(pb, 10, 16)
	if na == 0 || na != nb {
		return false
	}
	ipv6 := func(h string) bool { ip := net.ParseIP(h); return ip != nil && ip.To4() == nil }
	for _, h := range [][2]string{{ha, hb}, {hb, ha}} {
		switch h[0] {
		case "", "::":
			return true
		case "0.0.0.0":
			if !ipv6(h[1]) {
				return true
			}
		}
	}
	return strings.EqualFold(ha, hb)
}

// checkAddr accepts host:port with a numeric port.
func checkAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("bad listen address %q: want host:port, like 127.0.0.1:8080", addr)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || port == "" || n > 65535 {
		return fmt.Errorf("bad listen address %q: port must be a number from 0 to 65535", addr)
	}
	return nil
}
