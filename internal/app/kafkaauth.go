package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/idemkit/idem/idemkafka"
)

// SASL mechanisms of -kafka-sasl.
const (
	SASLPlain       = "plain"
	SASLScramSHA256 = "scram-sha-256"
	SASLScramSHA512 = "scram-sha-512"
	// EnvKafkaSASLPassword is the environment variable of the SASL
	// password. There is no flag for it: a flag's value shows in ps.
	EnvKafkaSASLPassword = "IDEMD_KAFKA_SASL_PASSWORD"
)

// kafkaDialTimeout bounds a connection's dial and TLS handshake (kgo's
// default dial timeout).
const kafkaDialTimeout = 10 * time.Second

// kafkaAuthSettings are the settings of KafkaAuth, only for a real cluster.
var kafkaAuthSettings = []string{"kafka-tls", "kafka-tls-ca", "kafka-tls-cert", "kafka-tls-key", "kafka-tls-server-name",
	"kafka-sasl", "kafka-sasl-user", "kafka-sasl-password-file"}

// KafkaAuth is how idemd connects to a real cluster (KafkaBrokers): TLS and
// SASL. The zero value is plaintext without authentication. Every Kafka
// client idemd makes for the cluster (the start-up check, the relay, the
// consumers, idemd demo's) gets the same options.
type KafkaAuth struct {
	// TLS turns TLS on (at least TLS 1.2), with the system's roots unless
	// TLSCA is set; any TLS* path or name implies it.
	TLS bool
	// TLSCA is a PEM file of the CA certificates that the brokers'
	// certificates must chain to, instead of the system's roots.
	TLSCA string
	// TLSCert and TLSKey are PEM files of a client certificate and its key,
	// for mutual TLS: both or neither.
	TLSCert, TLSKey string
	// TLSServerName is the host name the brokers' certificates must name.
	// Empty means each broker's host.
	TLSServerName string
	// SASL is the mechanism: "" (none), SASLPlain, SASLScramSHA256 or
	// SASLScramSHA512.
	SASL string
	// SASLUser and SASLPassword are the credentials (with SASL only).
	SASLUser     string
	SASLPassword Secret
	// SASLPasswordFile, when set, is the file SASLPassword was read from
	// (-kafka-sasl-password-file): every SASL authentication (a new
	// connection, a broker's connections.max.reauth.ms) reads it again,
	// so that a password rotated in the file is used without a restart.
	SASLPasswordFile string
}

// Secret is a string that does not print: fmt shows "xxxxx" (or nothing,
// when it is empty).
type Secret string

// String hides the secret.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return "xxxxx"
}

// GoString hides the secret from %#v.
func (s Secret) GoString() string { return strconv.Quote(s.String()) }

// LogValue hides the secret from log/slog, whatever the handler.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalText hides the secret from encoding/json and the other encoders.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// authError is a mistake in one of the settings of KafkaAuth.
type authError struct {
	setting string // the flag's name, without the dash
	msg     string
}

func (e *authError) Error() string { return "-" + e.setting + ": " + e.msg }

// parseKafkaAuth reads the settings of KafkaAuth: value returns a
// setting's value by flag name, given whether it was set (flag or
// environment), source names it for messages.
func parseKafkaAuth(value func(string) string, given func(string) bool, source func(string) string, getenv func(string) string) (KafkaAuth, error) {
	var k KafkaAuth
	tlsOn := false
	if v := strings.TrimSpace(value("kafka-tls")); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return KafkaAuth{}, fmt.Errorf("%s: %q is not true or false", source("kafka-tls"), v)
		}
		tlsOn = b
	}
	k.TLSCA = strings.TrimSpace(value("kafka-tls-ca"))
	k.TLSCert = strings.TrimSpace(value("kafka-tls-cert"))
	k.TLSKey = strings.TrimSpace(value("kafka-tls-key"))
	k.TLSServerName = strings.TrimSpace(value("kafka-tls-server-name"))
	for _, name := range []string{"kafka-tls-ca", "kafka-tls-cert", "kafka-tls-key", "kafka-tls-server-name"} {
		if strings.TrimSpace(value(name)) == "" {
			continue
		}
		if given("kafka-tls") && !tlsOn {
			return KafkaAuth{}, fmt.Errorf("%s is false, yet %s asks for TLS", source("kafka-tls"), source(name))
		}
		k.TLS = true
	}
	k.TLS = k.TLS || tlsOn
	switch {
	case k.TLSCert != "" && k.TLSKey == "":
		return KafkaAuth{}, fmt.Errorf("%s needs -kafka-tls-key too (the client certificate's key, for mutual TLS)", source("kafka-tls-cert"))
	case k.TLSKey != "" && k.TLSCert == "":
		return KafkaAuth{}, fmt.Errorf("%s needs -kafka-tls-cert too (the client certificate, for mutual TLS)", source("kafka-tls-key"))
	}
	if k.TLS {
		if _, err := k.tlsConfig(); err != nil {
			var ae *authError
			if errors.As(err, &ae) {
				return KafkaAuth{}, fmt.Errorf("%s: %s", source(ae.setting), ae.msg)
			}
			return KafkaAuth{}, err
		}
	}

	k.SASL = strings.ToLower(strings.TrimSpace(value("kafka-sasl")))
	k.SASLUser = strings.TrimSpace(value("kafka-sasl-user"))
	pwFile := strings.TrimSpace(value("kafka-sasl-password-file"))
	pwEnv := getenv(EnvKafkaSASLPassword)
	switch k.SASL {
	case "":
		for _, name := range []string{"kafka-sasl-user", "kafka-sasl-password-file"} {
			if given(name) {
				return KafkaAuth{}, fmt.Errorf("%s without -kafka-sasl (the SASL mechanism: plain, scram-sha-256 or scram-sha-512)", source(name))
			}
		}
		if pwEnv != "" {
			return KafkaAuth{}, fmt.Errorf("%s without -kafka-sasl (the SASL mechanism: plain, scram-sha-256 or scram-sha-512)", EnvKafkaSASLPassword)
		}
		return k, nil
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
	default:
		return KafkaAuth{}, fmt.Errorf("%s: %q is not a SASL mechanism idemd speaks: plain, scram-sha-256 or scram-sha-512", source("kafka-sasl"), value("kafka-sasl"))
	}
	if k.SASLUser == "" {
		return KafkaAuth{}, fmt.Errorf("%s %s needs a user: -kafka-sasl-user (IDEMD_KAFKA_SASL_USER)", source("kafka-sasl"), k.SASL)
	}
	switch {
	case pwFile != "" && pwEnv != "":
		return KafkaAuth{}, fmt.Errorf("the SASL password is given twice: %s or %s, not both", EnvKafkaSASLPassword, source("kafka-sasl-password-file"))
	case pwFile != "":
		pw, err := readPasswordFile(pwFile)
		if err != nil {
			return KafkaAuth{}, fmt.Errorf("%s: %s", source("kafka-sasl-password-file"), errMessage(err))
		}
		k.SASLPassword, k.SASLPasswordFile = pw, pwFile
	case pwEnv != "":
		k.SASLPassword = Secret(pwEnv)
	default:
		return KafkaAuth{}, fmt.Errorf("%s %s needs a password: set %s or -kafka-sasl-password-file (never a flag: it would show in ps)",
			source("kafka-sasl"), k.SASL, EnvKafkaSASLPassword)
	}
	return k, nil
}

// readPasswordFile reads a password file: one line, a trailing newline
// ignored. Its errors name the file, never quote its content.
func readPasswordFile(path string) (Secret, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	pw := strings.TrimRight(string(b), "\r\n")
	if pw == "" {
		return "", fmt.Errorf("the file %s is empty", path)
	}
	if strings.ContainsAny(pw, "\r\n") {
		// Sent whole, the server would refuse it with no hint why.
		return "", fmt.Errorf("the file %s holds more than one line; it must hold the password alone, on one line", path)
	}
	return Secret(pw), nil
}

// saslPassword returns the SASL password: SASLPasswordFile's content now,
// when it is set, else SASLPassword.
func (k KafkaAuth) saslPassword() (string, error) {
	if k.SASLPasswordFile == "" {
		return string(k.SASLPassword), nil
	}
	pw, err := readPasswordFile(k.SASLPasswordFile)
	if err != nil {
		return "", fmt.Errorf("-kafka-sasl-password-file: %s", errMessage(err))
	}
	return string(pw), nil
}

// kafkaAuthGiven returns the first of the settings of KafkaAuth that was
// set (by flag or environment, the password's variable included), or "".
func kafkaAuthGiven(given func(string) bool, source func(string) string, getenv func(string) string) string {
	for _, name := range kafkaAuthSettings {
		if given(name) {
			return source(name)
		}
	}
	if getenv(EnvKafkaSASLPassword) != "" {
		return EnvKafkaSASLPassword
	}
	return ""
}

// tlsConfig returns the TLS configuration of the clients, reading the
// files; its errors are *authError.
func (k KafkaAuth) tlsConfig() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: k.TLSServerName}
	if k.TLSCA != "" {
		b, err := os.ReadFile(k.TLSCA)
		if err != nil {
			return nil, &authError{"kafka-tls-ca", errMessage(err)}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, &authError{"kafka-tls-ca", fmt.Sprintf("%s holds no PEM certificate", k.TLSCA)}
		}
		c.RootCAs = pool
	}
	if k.TLSCert != "" || k.TLSKey != "" {
		cert, err := tls.LoadX509KeyPair(k.TLSCert, k.TLSKey)
		if err != nil {
			return nil, &authError{"kafka-tls-cert", fmt.Sprintf("%s with the key %s: %s", k.TLSCert, k.TLSKey, errMessage(err))}
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// kgoOpts returns the kgo options of the cluster's clients: TLS (its dial
// and handshake bounded by dialTimeout) and SASL. Its errors are
// *authError. The files of the TLS settings are read again for each
// connection, SASLPasswordFile for each SASL authentication.
func (k KafkaAuth) kgoOpts(dialTimeout time.Duration) ([]kgo.Opt, error) {
	var opts []kgo.Opt
	if k.TLS {
		c, err := k.tlsConfig()
		if err != nil {
			return nil, err
		}
		config := func() (*tls.Config, error) { return c, nil }
		if k.TLSCA != "" || k.TLSCert != "" {
			// Read again for every connection: a certificate renewed
			// (cert-manager) or a CA rotated in the files is used
			// without a restart.
			config = k.tlsConfig
		}
		opts = append(opts, kgo.Dialer(tlsDialer(config, dialTimeout)))
	}
	scramAuth := func(context.Context) (scram.Auth, error) {
		pw, err := k.saslPassword()
		return scram.Auth{User: k.SASLUser, Pass: pw}, err
	}
	switch k.SASL {
	case "":
	case SASLPlain:
		opts = append(opts, kgo.SASL(plain.Plain(func(context.Context) (plain.Auth, error) {
			pw, err := k.saslPassword()
			return plain.Auth{User: k.SASLUser, Pass: pw}, err
		})))
	case SASLScramSHA256:
		opts = append(opts, kgo.SASL(scram.Sha256(scramAuth)))
	case SASLScramSHA512:
		opts = append(opts, kgo.SASL(scram.Sha512(scramAuth)))
	default:
		return nil, &authError{"kafka-sasl", fmt.Sprintf("%q is not a SASL mechanism idemd speaks: plain, scram-sha-256 or scram-sha-512", k.SASL)}
	}
	return opts, nil
}

// logAttrs describe k for the start-up log (never the password).
func (k KafkaAuth) logAttrs() []any {
	attrs := []any{"tls", k.TLS}
	if k.SASL != "" {
		attrs = append(attrs, "sasl", k.SASL, "sasl_user", k.SASLUser)
	}
	return attrs
}

// tlsHandshakeError is a failed TLS handshake with a broker.
type tlsHandshakeError struct {
	addr string
	err  error
}

func (e *tlsHandshakeError) Error() string {
	return "TLS handshake with " + e.addr + " failed: " + e.err.Error()
}
func (e *tlsHandshakeError) Unwrap() error { return e.err }

// tlsDialer dials a broker and runs the TLS handshake, with the
// configuration config returns then, within timeout, and reports a failed
// handshake as a *tlsHandshakeError: kgo's own TLS dialer does not tell it
// from a failed dial.
func tlsDialer(config func() (*tls.Config, error), timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		cfg, err := config()
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		raw, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c := cfg.Clone()
		if c.ServerName == "" {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				_ = raw.Close()
				return nil, fmt.Errorf("unable to split host:port for dialing: %w", err)
			}
			c.ServerName = host
		}
		conn := tls.Client(raw, c)
		if err := conn.HandshakeContext(ctx); err != nil {
			_ = raw.Close()
			return nil, &tlsHandshakeError{addr: addr, err: err}
		}
		return conn, nil
	}
}

// connFailures is a kgo hook that keeps why connections failed, for
// checkKafka: kgo retries them, and a request that runs out of time
// returns the deadline, not the cause. It also tells a cluster that
// refused the SASL login for good, or a listener that closes every TLS
// handshake (a plaintext port: a Kafka broker closes the connection at
// a ClientHello's first bytes, which it reads as a request of over 350
// MB) (refused, when set, is called once): kgo would retry such a
// connection until the request's context ends.
type connFailures struct {
	// refused, when set, is called (once) when the cluster refused the
	// SASL login: it answered SASL_AUTHENTICATION_FAILED,
	// UNSUPPORTED_SASL_MECHANISM or ILLEGAL_SASL_STATE, or a broker
	// closed closesRefuse connections in a row during SASL
	// authentication; or when a broker closed closesRefuse
	// connections in a row during their TLS handshake.
	refused func()

	mu   sync.Mutex
	last error
	// sasl: a broker closed a connection during SASL authentication (as
	// some brokers refuse credentials, rather than with an error code).
	sasl bool
	// closes counts, per broker, its connections closed during SASL
	// authentication since it last took one; handshakes, those closed
	// during the TLS handshake.
	closes, handshakes map[int32]int
	// refusal is the refusal that called refused.
	refusal error
}

// closesRefuse is how many connections in a row a broker must close during
// SASL authentication, or during the TLS handshake, for connFailures to
// take it as a refusal: one may be a broker going away; kgo retries a
// closed connection at once on a new one, which a broker that refuses the
// login (or does not speak TLS on that port) closes too.
const closesRefuse = 2

func (h *connFailures) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		delete(h.closes, meta.NodeID)
		delete(h.handshakes, meta.NodeID)
		return
	}
	h.last = err
	if errors.Is(err, kerr.SaslAuthenticationFailed) || errors.Is(err, kerr.UnsupportedSaslMechanism) || errors.Is(err, kerr.IllegalSaslState) {
		h.refuse(err)
	}
	var hs *tlsHandshakeError
	if errors.As(err, &hs) && closedByPeer(err) {
		h.countClose(&h.handshakes, meta.NodeID, err)
	}
}

// countClose counts, in *counts, a connection to broker closed (err), and
// takes closesRefuse in a row as a refusal; h.mu is held.
func (h *connFailures) countClose(counts *map[int32]int, broker int32, err error) {
	if *counts == nil {
		*counts = map[int32]int{}
	}
	if (*counts)[broker]++; (*counts)[broker] >= closesRefuse {
		h.refuse(err)
	}
}

// closedByPeer reports whether err is the other side closing the
// connection: EOF, or a reset (a close with the client's bytes unread).
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

func (h *connFailures) OnBrokerRead(meta kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key != int16(kmsg.SASLAuthenticate) || err == nil {
		return
	}
	// The broker closed the connection; a reset or a timeout is not a
	// refusal.
	if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sasl = true
	h.countClose(&h.closes, meta.NodeID, err)
}

// refuse records the refusal err and calls refused, the first time; h.mu
// is held.
func (h *connFailures) refuse(err error) {
	if h.refusal != nil {
		return
	}
	h.refusal = err
	if h.refused != nil {
		h.refused()
	}
}

// get returns the last connection failure (the refusal, once there is
// one) and whether a broker closed a connection during SASL
// authentication.
func (h *connFailures) get() (error, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.refusal != nil {
		return h.refusal, h.sasl
	}
	return h.last, h.sasl
}

// kafkaError is a Kafka cluster that idemd could not use at start-up; its
// message names the cluster.
type kafkaError struct {
	msg string
	// unreachable: no broker answered (the cluster's refusals, its
	// missing topics and their errors are not), which checkKafka
	// retries within the start-up bound.
	unreachable bool
}

func (e *kafkaError) Error() string { return e.msg }

// kafkaCheckError says why checkKafka could not read the metadata of topic
// (and its dead-letter topic) from the cluster of seeds: the credentials,
// the TLS handshake, TLS or SASL missing, an ACL, or else unreachable.
func kafkaCheckError(seeds string, auth KafkaAuth, topic string, err error, seen *connFailures) error {
	if msg := kafkaRefusal(seeds, auth, topic, err, seen); msg != "" {
		return &kafkaError{msg: msg}
	}
	return &kafkaError{msg: fmt.Sprintf("kafka %s unreachable: %s", seeds, errMessage(kafkaCause(err, seen))), unreachable: true}
}

// kafkaCause is the cause of err, a request to the cluster that failed:
// the last connection failure seen, when err is only the deadline.
func kafkaCause(err error, seen *connFailures) error {
	if last, _ := seen.get(); last != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		return last
	}
	return err
}

// kafkaRefusal says why the cluster of seeds refused a client with auth
// (the credentials, the TLS handshake, TLS or SASL missing, an ACL), or
// returns "" when err is none of these (the cluster is unreachable).
func kafkaRefusal(seeds string, auth KafkaAuth, topic string, err error, seen *connFailures) string {
	_, saslClosed := seen.get()
	err = kafkaCause(err, seen)
	var (
		hs  *tlsHandshakeError
		eof *kgo.ErrFirstReadEOF
	)
	dlq := topic + idemkafka.DeadLetterSuffix
	switch {
	case errors.Is(err, kerr.SaslAuthenticationFailed):
		return fmt.Sprintf("kafka %s refused the credentials (SASL %s as user %s): %s", seeds, auth.SASL, auth.SASLUser, errMessage(err))
	case auth.SASL != "" && saslClosed:
		return fmt.Sprintf("kafka %s refused the credentials (SASL %s as user %s): the broker closed the connection during SASL authentication",
			seeds, auth.SASL, auth.SASLUser)
	case errors.Is(err, kerr.UnsupportedSaslMechanism):
		return fmt.Sprintf("kafka %s does not take SASL %s (-kafka-sasl): %s", seeds, auth.SASL, errMessage(err))
	case errors.Is(err, kerr.IllegalSaslState) && auth.SASL != "":
		// What a Kafka listener without SASL answers SaslHandshake.
		return fmt.Sprintf("kafka %s does not expect SASL on this listener (is it the port of the SASL listener? if the cluster has no SASL, drop -kafka-sasl): %s",
			seeds, errMessage(err))
	case errors.As(err, &hs):
		return fmt.Sprintf("%s%s", errMessage(hs), tlsHint(auth, hs.err))
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		who := "idemd"
		if auth.SASL != "" {
			who = "user " + auth.SASLUser
		}
		return fmt.Sprintf("kafka %s: %s may not describe the topic %s or %s (TOPIC_AUTHORIZATION_FAILED: an ACL is missing); "+
			"grant it DESCRIBE, READ and WRITE on both topics and READ on the consumer groups %s and %s",
			seeds, who, topic, dlq, ProjectionGroup, SagaGroup)
	case errors.Is(err, kerr.ClusterAuthorizationFailed):
		return fmt.Sprintf("kafka %s refused idemd (CLUSTER_AUTHORIZATION_FAILED: an ACL on the cluster is missing): %s", seeds, errMessage(err))
	case errors.As(err, &eof):
		hint := ""
		switch {
		case !auth.TLS && auth.SASL == "":
			hint = " (set -kafka-tls and -kafka-sasl as the cluster requires)"
		case !auth.TLS:
			hint = " (if the cluster requires TLS, set -kafka-tls)"
		case auth.SASL == "":
			hint = " (if the cluster requires SASL, set -kafka-sasl)"
		}
		return fmt.Sprintf("kafka %s closed the connection: %s%s", seeds, errMessage(err), hint)
	case !auth.TLS && isTLSAlertResponse(err):
		return fmt.Sprintf("kafka %s answered with a TLS alert: it is a TLS listener, set -kafka-tls (and -kafka-tls-ca unless the system's CAs signed its certificate): %s",
			seeds, errMessage(err))
	case isTLSAlert(err):
		return fmt.Sprintf("TLS with %s failed: %s%s", seeds, errMessage(err), tlsHint(auth, err))
	}
	return ""
}

// isTLSAlert reports whether err is a TLS alert from the broker (one that
// refused the client's certificate, sent after the client's side of a TLS
// 1.3 handshake is done).
func isTLSAlert(err error) bool {
	var alert tls.AlertError
	return errors.As(err, &alert) || strings.Contains(err.Error(), "remote error: tls:")
}

// isTLSAlertResponse reports whether err is kgo's refusal of a response
// that starts as a TLS alert record: the answer of a TLS listener (a Java
// broker's) to a plaintext request. kgo has no error type for it.
func isTLSAlertResponse(err error) bool {
	return strings.Contains(err.Error(), "appear to be a tls alert record")
}

// tlsHint suggests the setting that may fix a TLS failure.
func tlsHint(auth KafkaAuth, err error) string {
	var (
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		header   tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &unknown) && auth.TLSCA == "":
		return " (give the CA that signed the brokers' certificates with -kafka-tls-ca)"
	case errors.As(err, &unknown):
		return " (is -kafka-tls-ca the CA that signed the brokers' certificates?)"
	case errors.As(err, &hostname):
		return " (-kafka-tls-server-name sets the name the certificates must carry)"
	case errors.As(err, &header), errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded), closedByPeer(err):
		return " (is it a TLS listener? the broker did not answer in TLS)"
	case isTLSAlert(err) && auth.TLSCert == "":
		return " (does the cluster require a client certificate? -kafka-tls-cert, -kafka-tls-key)"
	}
	return ""
}
