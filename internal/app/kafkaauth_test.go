package app_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/stallmeter"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
)

// testPKI is a CA of a test, its certificates and their PEM files.
type testPKI struct {
	dir string
	ca  *x509.Certificate
	key *ecdsa.PrivateKey
	// pool trusts the CA.
	pool *x509.CertPool
	// caFile is the CA's certificate; server the brokers' certificate
	// (127.0.0.1 and localhost); clientCert and clientKey a client's
	// certificate and its key; junk a file that holds no PEM.
	caFile, clientCert, clientKey, junk string
	server                              tls.Certificate
}

// newPKI makes a self-signed CA, a certificate for 127.0.0.1 and a client
// certificate, and writes their PEM files to a temporary directory.
func newPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir()}
	var err error
	if p.key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "idemd test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &p.key.PublicKey, p.key)
	if err != nil {
		t.Fatal(err)
	}
	if p.ca, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	p.pool = x509.NewCertPool()
	p.pool.AddCert(p.ca)
	p.caFile = p.write(t, "ca.pem", "CERTIFICATE", der)
	serverDER, serverKey := p.issue(t, 2, "broker", x509.ExtKeyUsageServerAuth)
	p.server = tls.Certificate{Certificate: [][]byte{serverDER}, PrivateKey: serverKey}
	clientDER, clientKey := p.issue(t, 3, "idemd", x509.ExtKeyUsageClientAuth)
	p.clientCert = p.write(t, "client.pem", "CERTIFICATE", clientDER)
	keyDER, err := x509.MarshalECPrivateKey(clientKey)
	if err != nil {
		t.Fatal(err)
	}
	p.clientKey = p.write(t, "client-key.pem", "EC PRIVATE KEY", keyDER)
	p.junk = filepath.Join(p.dir, "junk.pem")
	if err := os.WriteFile(p.junk, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *testPKI) issue(t *testing.T, serial int64, name string, usage x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.key)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

func (p *testPKI) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// writeFile writes content to a new file of a temporary directory.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The TLS and SASL settings of a real cluster, from flags, the environment
// and files.
func TestParseConfigKafkaAuth(t *testing.T) {
	t.Parallel()
	pki := newPKI(t)
	pwFile := writeFile(t, "password", "s3cret-from-file\n")
	base := []string{"-kafka", "k1:9093"}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want app.KafkaAuth
	}{
		{"none", nil, nil, app.KafkaAuth{}},
		{"tls with the system roots", []string{"-kafka-tls"}, nil, app.KafkaAuth{TLS: true}},
		{"tls from the environment", nil, map[string]string{"IDEMD_KAFKA_TLS": "true"}, app.KafkaAuth{TLS: true}},
		{"a CA implies tls", nil, map[string]string{"IDEMD_KAFKA_TLS_CA": pki.caFile}, app.KafkaAuth{TLS: true, TLSCA: pki.caFile}},
		{"mutual tls", []string{"-kafka-tls-ca", pki.caFile, "-kafka-tls-cert", pki.clientCert, "-kafka-tls-key", pki.clientKey,
			"-kafka-tls-server-name", "kafka.internal"}, nil,
			app.KafkaAuth{TLS: true, TLSCA: pki.caFile, TLSCert: pki.clientCert, TLSKey: pki.clientKey, TLSServerName: "kafka.internal"}},
		{"scram over tls from the environment", nil, map[string]string{"IDEMD_KAFKA_TLS": "1", "IDEMD_KAFKA_SASL": "SCRAM-SHA-512",
			"IDEMD_KAFKA_SASL_USER": "idemd", "IDEMD_KAFKA_SASL_PASSWORD": "s3cret"},
			app.KafkaAuth{TLS: true, SASL: app.SASLScramSHA512, SASLUser: "idemd", SASLPassword: "s3cret"}},
		{"password from a file", []string{"-kafka-sasl", "scram-sha-256", "-kafka-sasl-user", "idemd", "-kafka-sasl-password-file", pwFile}, nil,
			app.KafkaAuth{SASL: app.SASLScramSHA256, SASLUser: "idemd", SASLPassword: "s3cret-from-file", SASLPasswordFile: pwFile}},
		{"plain", []string{"-kafka-sasl", "plain", "-kafka-sasl-user", "idemd"}, map[string]string{"IDEMD_KAFKA_SASL_PASSWORD": "s3cret"},
			app.KafkaAuth{SASL: app.SASLPlain, SASLUser: "idemd", SASLPassword: "s3cret"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := app.ParseConfig(append(append([]string{}, base...), tt.args...), envOf(tt.env))
			if err != nil || got.KafkaAuth != tt.want {
				t.Errorf("ParseConfig: KafkaAuth %+v, %v\nwant %+v", got.KafkaAuth, err, tt.want)
			}
		})
	}
}

// Each TLS or SASL mistake stops idemd at start-up (a ConfigError: exit 2)
// with one line naming the setting, and never the password.
func TestParseConfigKafkaAuthErrors(t *testing.T) {
	t.Parallel()
	pki := newPKI(t)
	emptyPW := writeFile(t, "empty", "\n")
	twoLines := writeFile(t, "two-lines", "s3cret\nold-s3cret\n")
	pwFile := writeFile(t, "password", "secret")
	missing := filepath.Join(t.TempDir(), "missing.pem")
	pw := map[string]string{"IDEMD_KAFKA_SASL_PASSWORD": "secret"}
	k := []string{"-kafka", "k1:9093"}
	with := func(args ...string) []string { return append(append([]string{}, k...), args...) }
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		mention string
	}{
		{"tls not a boolean", with("-kafka-tls=maybe"), nil, "-kafka-tls"},
		{"tls not a boolean from the environment", k, map[string]string{"IDEMD_KAFKA_TLS": "yes please"}, "IDEMD_KAFKA_TLS"},
		{"CA unreadable", with("-kafka-tls-ca", missing), nil, "-kafka-tls-ca"},
		{"CA not PEM", with("-kafka-tls-ca", pki.junk), nil, "no PEM certificate"},
		{"CA not PEM from the environment", k, map[string]string{"IDEMD_KAFKA_TLS_CA": pki.junk}, "IDEMD_KAFKA_TLS_CA"},
		{"CA with tls off", with("-kafka-tls=false", "-kafka-tls-ca", pki.caFile), nil, "-kafka-tls is false"},
		{"cert without key", with("-kafka-tls-cert", pki.clientCert), nil, "-kafka-tls-key"},
		{"key without cert", with("-kafka-tls-key", pki.clientKey), nil, "-kafka-tls-cert"},
		{"cert not PEM", with("-kafka-tls-cert", pki.junk, "-kafka-tls-key", pki.clientKey), nil, "-kafka-tls-cert"},
		{"key of another cert", with("-kafka-tls-cert", pki.caFile, "-kafka-tls-key", pki.clientKey), nil, "-kafka-tls-cert"},
		{"unknown mechanism", with("-kafka-sasl", "gssapi", "-kafka-sasl-user", "u"), pw, "scram-sha-256"},
		{"unknown mechanism from the environment", k, map[string]string{"IDEMD_KAFKA_SASL": "oauthbearer"}, "IDEMD_KAFKA_SASL"},
		{"sasl without user", with("-kafka-sasl", "plain"), pw, "-kafka-sasl-user"},
		{"sasl without password", with("-kafka-sasl", "scram-sha-256", "-kafka-sasl-user", "u"), nil, "IDEMD_KAFKA_SASL_PASSWORD"},
		{"password file unreadable", with("-kafka-sasl", "scram-sha-256", "-kafka-sasl-user", "u", "-kafka-sasl-password-file", missing), nil,
			"-kafka-sasl-password-file"},
		{"password file empty", with("-kafka-sasl", "scram-sha-256", "-kafka-sasl-user", "u", "-kafka-sasl-password-file", emptyPW), nil, "empty"},
		// A file of two lines (an old password left under the new one, a
		// key=value file) was sent whole as the password: the brokers
		// refused it, for a reason the error could not tell.
		{"password file of two lines", with("-kafka-sasl", "scram-sha-256", "-kafka-sasl-user", "u", "-kafka-sasl-password-file", twoLines), nil, "one line"},
		{"password twice", with("-kafka-sasl", "scram-sha-256", "-kafka-sasl-user", "u", "-kafka-sasl-password-file", pwFile), pw, "not both"},
		{"user without sasl", with("-kafka-sasl-user", "u"), nil, "without -kafka-sasl"},
		{"password without sasl", k, pw, "IDEMD_KAFKA_SASL_PASSWORD without -kafka-sasl"},
		{"tls with the embedded broker", []string{"-kafka-tls"}, nil, "-kafka-tls is only for"},
		{"sasl with kafka off", []string{"-kafka", "off", "-kafka-sasl", "plain"}, nil, "-kafka-sasl is only for"},
		{"CA with the embedded broker", nil, map[string]string{"IDEMD_KAFKA_TLS_CA": pki.caFile}, "plaintext"},
		{"password with kafka off", []string{"-kafka", "off"}, pw, "IDEMD_KAFKA_SASL_PASSWORD is only for"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			mustRefuse(t, tt.args, tt.env, tt.mention)
		})
	}
}

// The password is never printed with the configuration.
func TestKafkaAuthPasswordHidden(t *testing.T) {
	t.Parallel()
	cfg, err := app.ParseConfig([]string{"-kafka", "k:9093", "-kafka-sasl", "plain", "-kafka-sasl-user", "u"},
		envOf(map[string]string{"IDEMD_KAFKA_SASL_PASSWORD": "s3cret"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"%v", "%+v", "%#v", "%s"} {
		if s := fmt.Sprintf(f, cfg); strings.Contains(s, "s3cret") {
			t.Errorf("%s of the config shows the password: %s", f, s)
		}
	}
}

// securedCluster is a kfake cluster that speaks TLS only (certificate of
// pki) and requires SASL: the superuser idemd (SCRAM-SHA-256, password
// s3cret, every right) and the user reader (no ACL at all).
func securedCluster(t *testing.T, pki *testPKI, topic string) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{pki.server}, MinVersion: tls.VersionTLS12}),
		kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser("SCRAM-SHA-256", "idemd", "s3cret"),
		kfake.User("SCRAM-SHA-256", "reader", "r3ader"),
		kfake.SeedTopics(3, topic), kfake.SeedTopics(1, topic+".dlq"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	// The seeded topics are there for a client that authenticates.
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DialTLSConfig(&tls.Config{RootCAs: pki.pool, MinVersion: tls.VersionTLS12}),
		kgo.SASL(scram.Auth{User: "idemd", Pass: "s3cret"}.AsSha256Mechanism()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	md, err := kadm.NewClient(cl).Metadata(ctx, topic)
	if err != nil || md.Topics[topic].Err != nil {
		t.Fatalf("secured cluster: metadata of %s: %v %v", topic, err, md.Topics[topic].Err)
	}
	return c.ListenAddrs()
}

// idemd on a cluster with TLS (its CA given by file) and SASL SCRAM: the
// relay publishes an order's events, the saga and the projection consume
// them.
func TestKafkaSASLTLSEndToEnd(t *testing.T) {
	t.Parallel()
	pki := newPKI(t)
	topic := kafkatest.Name("idemd-secured")
	seeds := securedCluster(t, pki, topic)
	pwFile := writeFile(t, "password", "s3cret\n")
	s := serve(t, app.SQLite, "-kafka", strings.Join(seeds, ","), "-kafka-topic", topic,
		"-kafka-tls-ca", pki.caFile, "-kafka-sasl", "scram-sha-256", "-kafka-sasl-user", "idemd", "-kafka-sasl-password-file", pwFile)
	created := s.do(http.MethodPost, "/v1/orders", "order-1", orderBody(7, "19.90"))
	if created.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", created.status, created.body)
	}
	id, _ := created.json(t)["id"].(string)
	s.waitStatus(id, "CONFIRMED")
	s.waitSummary(7, "orders=1 pending=0 confirmed=1 rejected=0 total_amount=19.9000")
}

// idemd demo reads idemd's TLS and SASL settings from the same environment
// variables: with an idemd's environment it reproduces the events of a
// secured cluster.
func TestDemoSecuredKafka(t *testing.T) {
	t.Parallel()
	pki := newPKI(t)
	topic := kafkatest.Name("idemd-secured")
	seeds := strings.Join(securedCluster(t, pki, topic), ",")
	env := map[string]string{"IDEMD_KAFKA": seeds, "IDEMD_KAFKA_TOPIC": topic, "IDEMD_KAFKA_TLS_CA": pki.caFile,
		"IDEMD_KAFKA_SASL": "scram-sha-512", "IDEMD_KAFKA_SASL_USER": "idemd", "IDEMD_KAFKA_SASL_PASSWORD": "s3cret"}
	pwFile := writeFile(t, "password", "s3cret")
	s := serve(t, app.SQLite, "-kafka", seeds, "-kafka-topic", topic,
		"-kafka-tls-ca", pki.caFile, "-kafka-sasl", "scram-sha-256", "-kafka-sasl-user", "idemd", "-kafka-sasl-password-file", pwFile)
	// The superuser has SCRAM-SHA-256 credentials only: -kafka-sasl
	// overrides IDEMD_KAFKA_SASL.
	var stdout, stderr strings.Builder
	code := app.Run(context.Background(), []string{"demo", "-url", s.base, "-orders", "5", "-seed", "3", "-kafka-sasl", "scram-sha-256"},
		envOf(env), &stdout, &stderr)
	if code != 0 || !strings.Contains(stdout.String(), "OK: no double effects, nothing lost") ||
		!strings.Contains(stdout.String(), "kafka "+seeds+", topic "+topic) {
		t.Fatalf("demo: exit %d\n%s\n%s", code, stdout.String(), stderr.String())
	}
}

// A cluster that refuses idemd stops it at start-up (exit 1) with one line
// saying why: the credentials, the TLS handshake, TLS or SASL missing, an
// ACL; never "unreachable", never the password.
func TestKafkaAuthStartupFailures(t *testing.T) {
	t.Parallel()
	pki := newPKI(t)
	topic := kafkatest.Name("idemd-secured")
	seeds := strings.Join(securedCluster(t, pki, topic), ",")
	plainText := kafkatest.New(t)
	if plainText.Real() {
		t.Skip("needs kfake clusters with TLS and SASL")
	}
	alerting := tlsAlertListener(t)
	noSASL := noSASLListener(t, topic)
	scramEnv := func(user, pass string) map[string]string {
		return map[string]string{"IDEMD_KAFKA_SASL": "scram-sha-256", "IDEMD_KAFKA_SASL_USER": user, "IDEMD_KAFKA_SASL_PASSWORD": pass}
	}
	withTLS := func(env map[string]string) map[string]string {
		env["IDEMD_KAFKA_TLS_CA"] = pki.caFile
		return env
	}
	tests := []struct {
		name    string
		kafka   string
		env     map[string]string
		mention []string
	}{
		{"wrong password", seeds, withTLS(scramEnv("idemd", "wrong-secret")),
			[]string{"kafka " + seeds + " refused the credentials (SASL scram-sha-256 as user idemd)"}},
		{"unknown user", seeds, withTLS(scramEnv("nobody", "secret")), []string{"refused the credentials", "user nobody"}},
		{"no TLS to a TLS broker", seeds, scramEnv("idemd", "s3cret"), []string{"kafka " + seeds, "TLS", "-kafka-tls"}},
		{"CA not given", seeds, map[string]string{"IDEMD_KAFKA_TLS": "true", "IDEMD_KAFKA_SASL": "scram-sha-256",
			"IDEMD_KAFKA_SASL_USER": "idemd", "IDEMD_KAFKA_SASL_PASSWORD": "s3cret"},
			[]string{"TLS handshake with " + seeds + " failed", "unknown authority", "-kafka-tls-ca"}},
		{"no SASL", seeds, map[string]string{"IDEMD_KAFKA_TLS_CA": pki.caFile}, []string{"kafka " + seeds, "SASL", "-kafka-sasl"}},
		{"topic ACL missing", seeds, withTLS(scramEnv("reader", "r3ader")),
			[]string{"TOPIC_AUTHORIZATION_FAILED", "user reader", topic, "ACL"}},
		{"TLS to a plaintext broker", strings.Join(plainText.Seeds, ","), map[string]string{"IDEMD_KAFKA_TLS_CA": pki.caFile},
			[]string{"TLS handshake with " + plainText.Seeds[0] + " failed"}},
		// A Java broker's TLS listener answers a plaintext request with
		// a TLS alert (kfake's Go listener closes the connection).
		{"no TLS to a TLS broker that answers with an alert", alerting, map[string]string{},
			[]string{"kafka " + alerting, "TLS alert", "-kafka-tls"}},
		// A Kafka listener without SASL answers SaslHandshake with
		// ILLEGAL_SASL_STATE.
		{"SASL to a listener without SASL", noSASL, scramEnv("idemd", "s3cret"),
			[]string{"kafka " + noSASL, "ILLEGAL_SASL_STATE", "-kafka-sasl"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.env["IDEMD_KAFKA"] = tt.kafka
			tt.env["IDEMD_KAFKA_TOPIC"] = topic
			args := []string{"-addr", "127.0.0.1:0", "-db", testdb.SQLitePath(t), "-cleanup", "off"}
			begin := time.Now()
			// Bounded: an idemd that starts would serve until ctx ends.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var out, errOut strings.Builder
			code := app.Run(ctx, args, envOf(tt.env), &out, &errOut)
			stdout, stderr := out.String(), errOut.String()
			if code != 1 {
				t.Errorf("exit code %d, want 1 (stderr %q)", code, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			if strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, "idemd: ") || strings.Contains(stderr, "secret") ||
				strings.Contains(stderr, "s3cret") || strings.Contains(stderr, "unreachable") {
				t.Errorf("stderr %q: want one line, no password, not \"unreachable\"", stderr)
			}
			for _, m := range tt.mention {
				if !strings.Contains(stderr, m) {
					t.Errorf("stderr %q: want it to mention %q", stderr, m)
				}
			}
			// The check gives up after 10s; a loaded machine may add
			// a little.
			if d := time.Since(begin); d > time.Minute {
				t.Errorf("start-up took %s to fail", d)
			}
		})
	}
}

// A cluster that refuses idemd's SASL login stops it at once (exit 1, one
// line naming the refusal), not after the whole start-up check of 10 s:
// whether the broker answers SASL_AUTHENTICATION_FAILED (a Java broker)
// or closes the connection during the authentication (kfake, and brokers
// that refuse that way). kgo retries a connection that was closed, and
// idemd used to wait for the check's 10 s (wrong password: exit 1 after
// 10.3 s).
func TestKafkaRefusedCredentialsFailFast(t *testing.T) {
	t.Parallel()
	topic := kafkatest.Name("idemd-sasl")
	// The broker's answer to a wrong password: kfake closes the
	// connection; errorCode answers SASL_AUTHENTICATION_FAILED instead.
	cluster := func(t *testing.T, errorCode bool) string {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic, topic+".dlq"), kfake.EnableSASL(),
			kfake.Superuser("SCRAM-SHA-256", "idemd", "s3cret"), kfake.Superuser("PLAIN", "idemd", "s3cret"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		if errorCode {
			c.ControlKey(int16(kmsg.SASLAuthenticate), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				resp := kreq.ResponseKind().(*kmsg.SASLAuthenticateResponse)
				resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
				resp.ErrorMessage = kmsg.StringPtr("Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-256")
				return resp, nil, true
			})
		}
		return strings.Join(c.ListenAddrs(), ",")
	}
	for _, tt := range []struct {
		name            string
		errorCode       bool
		mech, user, pwd string
	}{
		{"wrong password, connection closed", false, "scram-sha-256", "idemd", "wr0ng-pw"},
		{"unknown user, connection closed", false, "scram-sha-256", "nobody", "wr0ng-pw"},
		{"plain, wrong password, connection closed", false, "plain", "idemd", "wr0ng-pw"},
		{"wrong password, SASL_AUTHENTICATION_FAILED", true, "scram-sha-256", "idemd", "wr0ng-pw"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			seeds := cluster(t, tt.errorCode)
			env := map[string]string{"IDEMD_KAFKA": seeds, "IDEMD_KAFKA_TOPIC": topic, "IDEMD_KAFKA_SASL": tt.mech,
				"IDEMD_KAFKA_SASL_USER": tt.user, "IDEMD_KAFKA_SASL_PASSWORD": tt.pwd}
			code, stderr, ran, stalled := runTimed(t, env)
			if code != 1 {
				t.Errorf("exit code %d, want 1 (stderr %q)", code, stderr)
			}
			// The last line (PLAIN without TLS logs a warning first).
			lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
			want := "idemd: kafka " + seeds + " refused the credentials (SASL " + tt.mech + " as user " + tt.user + "): "
			if !strings.HasPrefix(lines[len(lines)-1], want) || strings.Contains(stderr, tt.pwd) {
				t.Errorf("stderr %q: want it to end with a line starting %q, and no password", stderr, want)
			}
			// Half the check's 10 s: the database's start-up and the
			// refusal take well under a second on an idle machine.
			if ran > 5*time.Second {
				t.Errorf("start-up took %s (less the process's stalls of %s) to fail, want the refusal at once", ran, stalled)
			}
		})
	}
}

// runTimed runs idemd on SQLite with env, bounded (an idemd that starts
// would serve until its context ends), and returns its exit code, its
// stderr, and how long it ran, less the process's stalls (stalled).
func runTimed(t *testing.T, env map[string]string) (code int, stderr string, ran, stalled time.Duration) {
	t.Helper()
	args := []string{"-addr", "127.0.0.1:0", "-db", testdb.SQLitePath(t), "-cleanup", "off"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errOut strings.Builder
	m := stallmeter.Start(t)
	code = app.Run(ctx, args, envOf(env), &out, &errOut)
	ran, stalled = m.Elapsed()
	return code, errOut.String(), ran, stalled
}

// A broker that closes one connection during the SASL authentication (a
// broker going away, a proxy's hiccup) and takes the next is no refusal:
// idemd starts.
func TestKafkaSASLOneClosedConnectionStarts(t *testing.T) {
	t.Parallel()
	topic := kafkatest.Name("idemd-sasl")
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic, topic+".dlq"), kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-256", "idemd", "s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	// The first SASLAuthenticate closes its connection; the others are
	// the cluster's.
	c.ControlKey(int16(kmsg.SASLAuthenticate), func(kmsg.Request) (kmsg.Response, error, bool) {
		return nil, errors.New("closed during the authentication"), true
	})
	mustStartOnKafka(t, "one connection closed during SASL", map[string]string{"IDEMD_KAFKA_SASL_PASSWORD": "s3cret"},
		"-kafka", strings.Join(c.ListenAddrs(), ","), "-kafka-topic", topic, "-kafka-sasl", "scram-sha-256", "-kafka-sasl-user", "idemd")
}

// mustStartOnKafka starts an app on SQLite with the Kafka flags and env
// given, and closes it; it fails t (after what) if it does not start.
func mustStartOnKafka(t *testing.T, after string, env map[string]string, kafkaFlags ...string) {
	t.Helper()
	cfg, err := app.ParseConfig(append([]string{"-db", "sqlite:" + testdb.SQLitePath(t), "-cleanup", "off"}, kafkaFlags...), envOf(env))
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.New(context.Background(), cfg, newTestLogger(io.Discard))
	if err != nil {
		t.Fatalf("app.New after %s: %v", after, err)
	}
	a.Close()
}

// Mutual TLS: a broker that requires a client certificate takes idemd's
// (-kafka-tls-cert, -kafka-tls-key) and refuses idemd without one.
func TestKafkaMutualTLS(t *testing.T) {
	t.Parallel()
	pki := newPKI(t)
	topic := kafkatest.Name("idemd-mtls")
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic, topic+".dlq"),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{pki.server}, ClientCAs: pki.pool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	seeds := strings.Join(c.ListenAddrs(), ",")
	for _, withCert := range []bool{true, false} {
		args := []string{"-db", "sqlite:" + testdb.SQLitePath(t), "-cleanup", "off", "-kafka", seeds, "-kafka-topic", topic, "-kafka-tls-ca", pki.caFile}
		if withCert {
			args = append(args, "-kafka-tls-cert", pki.clientCert, "-kafka-tls-key", pki.clientKey)
		}
		cfg, err := app.ParseConfig(args, envOf(nil))
		if err != nil {
			t.Fatal(err)
		}
		a, err := app.New(context.Background(), cfg, newTestLogger(io.Discard))
		if err == nil {
			a.Close()
		}
		switch {
		case withCert && err != nil:
			t.Errorf("with a client certificate: %v", err)
		case !withCert && err == nil:
			t.Errorf("without a client certificate: idemd started")
		case !withCert && (!strings.Contains(err.Error(), "TLS with "+seeds+" failed") || !strings.Contains(err.Error(), "-kafka-tls-cert")):
			t.Errorf("without a client certificate: %q, want it to say TLS failed and name -kafka-tls-cert", err)
		}
	}
}

// SASL PLAIN without TLS sends the password in clear: idemd says so when it
// starts.
func TestKafkaSASLPlainWithoutTLSWarns(t *testing.T) {
	t.Parallel()
	topic := kafkatest.Name("idemd-plain")
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic, topic+".dlq"),
		kfake.EnableSASL(), kfake.Superuser("PLAIN", "idemd", "s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cfg, err := app.ParseConfig([]string{"-db", "sqlite:" + testdb.SQLitePath(t), "-cleanup", "off", "-kafka", strings.Join(c.ListenAddrs(), ","),
		"-kafka-topic", topic, "-kafka-sasl", "plain", "-kafka-sasl-user", "idemd"}, envOf(map[string]string{"IDEMD_KAFKA_SASL_PASSWORD": "s3cret"}))
	if err != nil {
		t.Fatal(err)
	}
	var logs testlog.Buffer
	a, err := app.New(context.Background(), cfg, newTestLogger(&logs))
	if err != nil {
		t.Fatalf("app.New: %v", err)
	}
	a.Close()
	if l := logs.String(); !strings.Contains(l, "in clear") || strings.Contains(l, "s3cret") {
		t.Errorf("logs: want a warning that the password goes in clear, without it:\n%s", l)
	}
}

// listenLocal listens on a free port of 127.0.0.1 until t ends.
func listenLocal(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// tlsAlertListener is a broker's TLS listener as a Java broker is one to a
// plaintext client: it answers the first bytes with a TLS alert record
// (TLS 1.2, fatal, unexpected_message) and closes the connection. It
// returns its address.
func tlsAlertListener(t *testing.T) string {
	t.Helper()
	ln := listenLocal(t)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = conn.Close() }()
				_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
				if _, err := conn.Read(make([]byte, 512)); err != nil {
					return
				}
				_, _ = conn.Write([]byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x0a})
			}()
		}
	}()
	return ln.Addr().String()
}

// noSASLListener is a kfake cluster without SASL that answers SaslHandshake
// as a Kafka broker's listener without SASL does (KafkaApis: the request
// reaches it, ILLEGAL_SASL_STATE). It returns its seed brokers.
func noSASLListener(t *testing.T, topic string) string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic, topic+".dlq"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	c.ControlKey(int16(kmsg.SASLHandshake), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		resp := kreq.ResponseKind().(*kmsg.SASLHandshakeResponse)
		resp.ErrorCode = kerr.IllegalSaslState.Code
		return resp, nil, true
	})
	return strings.Join(c.ListenAddrs(), ",")
}

// The password does not show whichever way a config is printed, logged or
// encoded.
func TestSecretHidden(t *testing.T) {
	const pw = "hunter2-very-secret"
	k := app.KafkaAuth{SASL: app.SASLScramSHA256, SASLUser: "idemd", SASLPassword: app.Secret(pw)}
	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("config", "kafka", k, "password", k.SASLPassword)
	slog.New(slog.NewTextHandler(&logs, nil)).Info("config", "kafka", k, "password", k.SASLPassword)
	js, err := json.Marshal(k)
	if err != nil {
		t.Fatal(err)
	}
	for what, out := range map[string]string{
		"%v": fmt.Sprintf("%v", k), "%+v": fmt.Sprintf("%+v", k), "%#v": fmt.Sprintf("%#v", k), "Sprint": fmt.Sprint(k.SASLPassword),
		"slog": logs.String(), "json": string(js),
	} {
		if strings.Contains(out, pw) {
			t.Errorf("%s shows the password: %s", what, out)
		}
	}
}

// idemd demo given credentials the cluster refuses says so, as idemd's
// start-up check does, not "unreachable"; and it never shows the password.
func TestDemoRefusedCredentials(t *testing.T) {
	t.Parallel()
	pki := newPKI(t)
	topic := kafkatest.Name("idemd-secured")
	seeds := strings.Join(securedCluster(t, pki, topic), ",")
	pwFile := writeFile(t, "password", "s3cret")
	s := serve(t, app.SQLite, "-kafka", seeds, "-kafka-topic", topic,
		"-kafka-tls-ca", pki.caFile, "-kafka-sasl", "scram-sha-256", "-kafka-sasl-user", "idemd", "-kafka-sasl-password-file", pwFile)
	env := map[string]string{"IDEMD_KAFKA": seeds, "IDEMD_KAFKA_TOPIC": topic, "IDEMD_KAFKA_TLS_CA": pki.caFile,
		"IDEMD_KAFKA_SASL": "scram-sha-256", "IDEMD_KAFKA_SASL_USER": "idemd", "IDEMD_KAFKA_SASL_PASSWORD": "wr0ng-pw"}
	var stdout, stderr strings.Builder
	code := app.Run(context.Background(), []string{"demo", "-url", s.base, "-orders", "2", "-seed", "3", "-timeout", "30s"},
		envOf(env), &stdout, &stderr)
	out := stdout.String() + stderr.String()
	if code == 0 || !strings.Contains(out, "refused the credentials") || strings.Contains(out, "unreachable") || strings.Contains(out, "wr0ng-pw") {
		t.Fatalf("demo with a wrong password: exit %d; want a failure saying the credentials were refused, without the password\n%s", code, out)
	}
}

// kafkaPlaintextListener is what a Kafka broker's plaintext listener is to
// a TLS client: it reads the request's size, and the first four bytes of a
// ClientHello (0x16 0x03 0x01 ...) give over 350 MB, more than the
// broker's socket.request.max.bytes, so it closes the connection
// ("Invalid receive"). closeFirst > 0 closes only that many connections,
// and forwards the others to the broker at to (a broker going away during
// a handshake). It returns its address.
func kafkaPlaintextListener(t *testing.T, closeFirst int, to string) string {
	t.Helper()
	ln := listenLocal(t)
	go func() {
		for n := 0; ; n++ {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			if closeFirst > 0 && n >= closeFirst {
				go forward(conn, to)
				continue
			}
			go func() {
				defer func() { _ = conn.Close() }()
				_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
				_, _ = io.ReadFull(conn, make([]byte, 4))
			}()
		}
	}()
	return ln.Addr().String()
}

// forward copies conn to a new connection to addr and back, until either
// side closes.
func forward(conn net.Conn, addr string) {
	defer func() { _ = conn.Close() }()
	up, err := net.Dial("tcp", addr)
	if err != nil {
		return
	}
	defer func() { _ = up.Close() }()
	splice(conn, up)
}

// splice copies a to b and b to a until either side ends; the caller
// closes both.
func splice(a, b net.Conn) {
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(b, a); done <- struct{}{} }()
	go func() { _, _ = io.Copy(a, b); done <- struct{}{} }()
	<-done
}

// idemd with -kafka-tls pointed at a broker's plaintext port stops at once
// (exit 1, one line: the handshake failed, is it a TLS listener?), not
// after the whole start-up check of 10 s: the broker closes each
// connection as its handshake begins, and kgo retries a closed connection
// (exit 1 after 10.2 s before).
func TestKafkaTLSToPlaintextListenerFailsFast(t *testing.T) {
	t.Parallel()
	pki := newPKI(t)
	seeds := kafkaPlaintextListener(t, 0, "")
	env := map[string]string{"IDEMD_KAFKA": seeds, "IDEMD_KAFKA_TOPIC": kafkatest.Name("idemd-tls"), "IDEMD_KAFKA_TLS_CA": pki.caFile}
	code, stderr, ran, stalled := runTimed(t, env)
	if code != 1 {
		t.Errorf("exit code %d, want 1 (stderr %q)", code, stderr)
	}
	want := "idemd: TLS handshake with " + seeds + " failed: "
	if !strings.HasPrefix(stderr, want) || !strings.Contains(stderr, "is it a TLS listener?") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("stderr %q: want one line starting %q that asks whether it is a TLS listener", stderr, want)
	}
	// Half the check's 10 s: the database's start-up and the refusal
	// take well under a second on an idle machine.
	if ran > 5*time.Second {
		t.Errorf("start-up took %s (less the process's stalls of %s) to fail, want the refusal at once", ran, stalled)
	}
}

// A broker that closes one connection during its TLS handshake (a broker
// going away, a proxy's hiccup) and takes the next is no refusal: idemd
// starts.
func TestKafkaTLSOneClosedHandshakeStarts(t *testing.T) {
	t.Parallel()
	pki := newPKI(t)
	topic := kafkatest.Name("idemd-tls")
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic, topic+".dlq"),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{pki.server}, MinVersion: tls.VersionTLS12}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	seeds := kafkaPlaintextListener(t, 1, c.ListenAddrs()[0])
	mustStartOnKafka(t, "one connection closed during the TLS handshake", nil, "-kafka", seeds, "-kafka-topic", topic, "-kafka-tls-ca", pki.caFile)
}

// idemd demo with -kafka-tls pointed at a broker's plaintext port says so
// at once, as idemd's start-up check does (its Ping takes the first
// failure), not after its -timeout, and not as "unreachable".
func TestDemoTLSToPlaintextListener(t *testing.T) {
	t.Parallel()
	pki := newPKI(t)
	seeds := kafkaPlaintextListener(t, 0, "")
	s := serve(t, app.SQLite)
	env := map[string]string{"IDEMD_KAFKA": seeds, "IDEMD_KAFKA_TOPIC": kafkatest.Name("idemd-tls"), "IDEMD_KAFKA_TLS_CA": pki.caFile}
	var stdout, stderr strings.Builder
	m := stallmeter.Start(t)
	code := app.Run(context.Background(), []string{"demo", "-url", s.base, "-orders", "2", "-seed", "3", "-timeout", "30s"},
		envOf(env), &stdout, &stderr)
	ran, stalled := m.Elapsed()
	out := stdout.String() + stderr.String()
	if code == 0 || !strings.Contains(out, "TLS handshake with "+seeds+" failed") || !strings.Contains(out, "is it a TLS listener?") || strings.Contains(out, "unreachable") {
		t.Fatalf("demo with TLS to a plaintext port: exit %d; want a failure naming the TLS handshake\n%s", code, out)
	}
	// Its 2 orders and their settling take a second or two on an idle
	// machine; the Kafka step then fails at once, not at the 30 s timeout.
	if ran > 15*time.Second {
		t.Errorf("demo took %s (less the process's stalls of %s) to fail, want the refusal at once\n%s", ran, stalled, out)
	}
}
