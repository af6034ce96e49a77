package app_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/kafkatest"
)

// replaceFile gives path new content the way Kubernetes updates a mounted
// secret: a new file renamed over the old one, never a half-written one.
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".new")
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// The SASL password rotated under a running idemd (Vault, a scheduled
// rotation): the new one written to -kafka-sasl-password-file, the old one
// revoked on the cluster. idemd's connections authenticate again (the
// brokers' connections.max.reauth.ms, a reconnection after a broker's
// restart) with the file's new password, and the next order's events still
// flow; they were stuck until idemd restarted when it kept the password it
// had read at start-up.
func TestKafkaSASLPasswordRotation(t *testing.T) {
	t.Parallel()
	topic := kafkatest.Name("idemd-rotate")
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond),
		kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "idemd", "old-s3cret"),
		// Every connection authenticates again within a second and a half.
		kfake.BrokerConfigs(map[string]string{"connections.max.reauth.ms": "1500"}),
		kfake.SeedTopics(3, topic), kfake.SeedTopics(1, topic+".dlq"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	seeds := strings.Join(c.ListenAddrs(), ",")
	pwFile := writeFile(t, "password", "old-s3cret\n")
	s := serve(t, app.SQLite, "-kafka", seeds, "-kafka-topic", topic,
		"-kafka-sasl", "scram-sha-256", "-kafka-sasl-user", "idemd", "-kafka-sasl-password-file", pwFile)
	first := s.do(http.MethodPost, "/v1/orders", "order-1", orderBody(7, "19.90"))
	if first.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", first.status, first.body)
	}
	id, _ := first.json(t)["id"].(string)
	s.waitStatus(id, "CONFIRMED")

	// Rotate: the file first (the new password is not valid yet, so no
	// connection opens with it in between), then the cluster.
	replaceFile(t, pwFile, "new-s3cret\n")
	adm, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.SASL(scram.Auth{User: "idemd", Pass: "old-s3cret"}.AsSha256Mechanism()))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	altered, err := kadm.NewClient(adm).AlterUserSCRAMs(ctx, nil,
		[]kadm.UpsertSCRAM{{User: "idemd", Mechanism: kadm.ScramSha256, Iterations: 4096, Password: "new-s3cret"}})
	if err == nil {
		err = altered.Error()
	}
	if err != nil {
		t.Fatalf("rotating the password on the cluster: %v", err)
	}
	// Every connection of idemd's has authenticated again (or failed to)
	// by now.
	time.Sleep(3 * time.Second)

	second := s.do(http.MethodPost, "/v1/orders", "order-2", orderBody(7, "5.00"))
	if second.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", second.status, second.body)
	}
	id, _ = second.json(t)["id"].(string)
	s.waitStatus(id, "CONFIRMED")
	s.waitSummary(7, "orders=2 pending=0 confirmed=2 rejected=0 total_amount=24.9000")
}

// brokerConns is a kfake.ListenFn that keeps the connections the brokers
// accept, so that a test can drop them all, as a broker's restart does.
type brokerConns struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (b *brokerConns) listen(network, address string) (net.Listener, error) {
	ln, err := net.Listen(network, address)
	if err != nil {
		return nil, err
	}
	return &trackedListener{Listener: ln, b: b}, nil
}

// dropAll closes every connection accepted so far: the clients reconnect.
func (b *brokerConns) dropAll() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.conns {
		_ = c.Close()
	}
	n := len(b.conns)
	b.conns = nil
	return n
}

type trackedListener struct {
	net.Listener
	b *brokerConns
}

func (l *trackedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.b.mu.Lock()
		l.b.conns = append(l.b.conns, c)
		l.b.mu.Unlock()
	}
	return c, err
}

// pemDER returns the DER of the first PEM block of file.
func pemDER(t *testing.T, file string) []byte {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", file)
	}
	return blk.Bytes
}

// copyFile gives dst (a file idemd reads) src's content, as a rotation does.
func copyFile(t *testing.T, dst, src string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	replaceFile(t, dst, string(b))
}

// The client certificate renewed (cert-manager) and the CA rotated under a
// running idemd with mutual TLS: the new files are written over the old
// ones, the brokers switch to a certificate of the new CA and refuse the
// old client certificate, and the connections are dropped (a broker's
// restart). idemd's new connections present the new certificate and trust
// the new CA, and the next order's events still flow; they were refused
// until idemd restarted when it kept the files' content of its start-up.
func TestKafkaTLSCertificateRotation(t *testing.T) {
	t.Parallel()
	oldPKI, newPKI := newPKI(t), newPKI(t)
	topic := kafkatest.Name("idemd-rotate-tls")
	var (
		serverCert atomic.Pointer[tls.Certificate]
		revoked    atomic.Pointer[[]byte]
		conns      brokerConns
	)
	serverCert.Store(&oldPKI.server)
	clientCAs := x509.NewCertPool()
	clientCAs.AddCert(oldPKI.ca)
	clientCAs.AddCert(newPKI.ca)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond),
		kfake.ListenFn(conns.listen),
		kfake.TLS(&tls.Config{MinVersion: tls.VersionTLS12, ClientCAs: clientCAs, ClientAuth: tls.RequireAndVerifyClientCert,
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return serverCert.Load(), nil },
			VerifyConnection: func(cs tls.ConnectionState) error {
				if r := revoked.Load(); r != nil && len(cs.PeerCertificates) > 0 && bytes.Equal(cs.PeerCertificates[0].Raw, *r) {
					return errors.New("client certificate revoked")
				}
				return nil
			}}),
		kfake.SeedTopics(3, topic), kfake.SeedTopics(1, topic+".dlq"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	seeds := strings.Join(c.ListenAddrs(), ",")
	s := serve(t, app.SQLite, "-kafka", seeds, "-kafka-topic", topic,
		"-kafka-tls-ca", oldPKI.caFile, "-kafka-tls-cert", oldPKI.clientCert, "-kafka-tls-key", oldPKI.clientKey)
	first := s.do(http.MethodPost, "/v1/orders", "order-1", orderBody(7, "19.90"))
	if first.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", first.status, first.body)
	}
	id, _ := first.json(t)["id"].(string)
	s.waitStatus(id, "CONFIRMED")

	// Rotate the files idemd was started with, then the brokers.
	oldClient := pemDER(t, oldPKI.clientCert)
	copyFile(t, oldPKI.caFile, newPKI.caFile)
	copyFile(t, oldPKI.clientKey, newPKI.clientKey)
	copyFile(t, oldPKI.clientCert, newPKI.clientCert)
	serverCert.Store(&newPKI.server)
	revoked.Store(&oldClient)
	if n := conns.dropAll(); n == 0 {
		t.Fatal("idemd had no connection to the broker")
	}

	second := s.do(http.MethodPost, "/v1/orders", "order-2", orderBody(7, "5.00"))
	if second.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", second.status, second.body)
	}
	id, _ = second.json(t)["id"].(string)
	s.waitStatus(id, "CONFIRMED")
	s.waitSummary(7, "orders=2 pending=0 confirmed=2 rejected=0 total_amount=24.9000")
}
