package rabbitmq

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// selfSigned returns a server certificate for 127.0.0.1 and a pool that
// trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "berth test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:                  true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

// TestTLS connects with amqps:// through a TLS-terminating proxy: with
// Options.TLS trusting the proxy's certificate it publishes and consumes;
// without it the handshake fails with the certificate error, not a
// retryable one.
func TestTLS(t *testing.T) {
	url := serverURL(t)
	cert, pool := selfSigned(t)
	_, amqps := newTLSProxy(t, url, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if !strings.HasPrefix(amqps, "amqps://") {
		t.Fatalf("proxy URL %q is not amqps", amqps)
	}
	q := testQueue(t, url)
	b := newBroker(t, amqps, Options{TLS: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, Logger: quiet})
	ctx := t.Context()
	m := &sdk.Message{Type: "tls", Body: []byte("over TLS")}
	if err := b.Publish(ctx, q, m); err != nil {
		t.Fatalf("Publish over TLS: %v", err)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ds[0].Message().ID != m.ID {
		t.Fatalf("received %s, want %s", ds[0].Message().ID, m.ID)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}

	// Without the pool the certificate is not trusted.
	_, err = New(ctx, amqps, Options{Logger: quiet})
	if err == nil {
		t.Fatal("New trusted a self-signed certificate without Options.TLS")
	}
	var ce *tls.CertificateVerificationError
	if !errors.As(err, &ce) || errors.Is(err, sdk.ErrUnavailable) {
		t.Errorf("untrusted certificate: %v, want a *tls.CertificateVerificationError, not ErrUnavailable (waiting will not help)", err)
	}
}
