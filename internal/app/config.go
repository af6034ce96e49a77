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
)

// Defaults of Config.
const (
	DefaultAddr            = "127.0.0.1:8080"
	DefaultDB              = "./idemd.db"
	DefaultShutdownTimeout = 15 * time.Second
	DefaultLogFormat       = "json"
	// DefaultCleanup is the retention sweep's schedule: daily at 03:00
	// local time, as in the style guide.
	DefaultCleanup = "0 3 * * *"
	// CleanupOff as Config.Cleanup disables the retention sweep (another
	// replica or a job runs it).
	CleanupOff = "off"
	// DefaultKafka is the default -kafka: an in-process broker.
	DefaultKafka = KafkaEmbedded
	// DefaultKafkaTopic is the topic of the order events.
	DefaultKafkaTopic = "idemd.orders"
)

// Config is idemd's configuration.
type Config struct {
	// Addr is the TCP address to listen on. Defaults to 127.0.0.1:8080.
	Addr string
	// DB is the database. Defaults to the SQLite file ./idemd.db.
	DB Database
	// ShutdownTimeout bounds how long a shutdown waits for in-flight
	// requests. Defaults to 15s.
	ShutdownTimeout time.Duration
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
	// KafkaTopic is the topic of the order events. Defaults to
	// DefaultKafkaTopic.
	KafkaTopic string
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
	{"db", "IDEMD_DB", DefaultDB, "database: postgres://user:pass@host/db, sqlite:PATH or a file path"},
	{"shutdown-timeout", "IDEMD_SHUTDOWN_TIMEOUT", DefaultShutdownTimeout.String(), "how long shutdown waits for in-flight requests"},
	{"log-format", "IDEMD_LOG_FORMAT", DefaultLogFormat, "log format: json or text"},
	{"cleanup", "IDEMD_CLEANUP", DefaultCleanup, "cron schedule of the retention sweep (minute hour day month weekday), or off"},
	{"kafka", "IDEMD_KAFKA", DefaultKafka, "Kafka for the order events: embedded (in-process broker, one replica only), off (events stay in the outbox), or seed brokers host:port,host:port"},
	{"kafka-topic", "IDEMD_KAFKA_TOPIC", DefaultKafkaTopic, "Kafka topic of the order events (dead letters go to TOPIC.dlq)"},
}

// Usage describes the flags and environment variables.
func Usage() string {
	var b strings.Builder
	b.WriteString("usage: idemd [flags]\n\nFlags override the environment variable named after each one.\n\n")
	for _, s := range settings {
		fmt.Fprintf(&b, "  -%s (%s, default %q)\n    \t%s\n", s.flag, s.env, s.def, s.usage)
	}
	return b.String()
}

// ParseConfig reads the configuration from the environment (getenv) and the
// command-line arguments, which take precedence. It returns flag.ErrHelp for
// -h, and a *ConfigError for anything invalid.
func ParseConfig(args []string, getenv func(string) string) (Config, error) {
	fs := flag.NewFlagSet("idemd", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // Run prints one line, not the flag package's usage
	values := make(map[string]*string, len(settings))
	for _, s := range settings {
		def := s.def
		if v := getenv(s.env); v != "" {
			def = v
		}
		values[s.flag] = fs.String(s.flag, def, s.usage)
	}
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

	cfg := Config{Addr: *values["addr"], LogFormat: *values["log-format"], Cleanup: strings.TrimSpace(*values["cleanup"])}
	if err := checkAddr(cfg.Addr); err != nil {
		return Config{}, configErrorf("%s: %v", source("addr"), err)
	}
	db, err := ParseDatabase(*values["db"])
	if err != nil {
		return Config{}, configErrorf("%s: %v", source("db"), err)
	}
	cfg.DB = db
	d, err := time.ParseDuration(*values["shutdown-timeout"])
	if err != nil || d <= 0 {
		return Config{}, configErrorf("%s: %q is not a positive duration like 15s", source("shutdown-timeout"), *values["shutdown-timeout"])
	}
	cfg.ShutdownTimeout = d
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
	return cfg, nil
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
