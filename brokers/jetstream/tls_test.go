package jetstream_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// privateServer starts a nats-server of the test's own (the shared one is
// never reconfigured) with JetStream, TLS from a fresh self-signed
// certificate and a user/password, and returns its URL and a client TLS
// configuration that trusts it.
func privateServer(t *testing.T, user, pass string) (string, *tls.Config) {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		if integration.InCI() {
			t.Fatalf("integration: nats-server not installed (CI=true: integration tests must not skip)")
		}
		t.Skipf("integration: nats-server not installed: %v", err)
	}
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "berth-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0") // a free port
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", filepath.Join(dir, "js"),
		"--tls", "--tlscert", certFile, "--tlskey", keyFile, "--user", user, "--pass", pass)
	srv := integration.StartChild(t, cmd) // a private server: it dies with this test, and with this process
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
			_ = c.Close()
			break
		}
		select {
		case <-srv.Done(): // a bad flag, the port taken meanwhile: its stderr says which
			t.Fatalf("private nats-server exited: %v", srv.Wait())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("private nats-server did not start")
		}
	}
	pool := x509.NewCertPool()
	cert, _ := x509.ParseCertificate(der)
	pool.AddCert(cert)
	return "tls://127.0.0.1:" + strconv.Itoa(port), &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// TestTLSAndCredentials connects over TLS with a user and password to a
// private server: the right ones work end to end, a wrong password or an
// untrusted certificate is refused, and no error repeats the password.
func TestTLSAndCredentials(t *testing.T) {
	const secret = "s3cret-Pa55"
	url, cfg := privateServer(t, "berth", secret)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	b, err := jetstream.Connect(ctx, url, jetstream.ConnectOptions{TLS: cfg, User: "berth", Password: secret}, testOpts)
	if err != nil {
		t.Fatalf("Connect over TLS: %v", err)
	}
	defer b.Close()
	if !b.Conn().TLSRequired() {
		t.Error("connection is not TLS")
	}
	if err := b.Publish(ctx, "tls_q", &sdk.Message{Type: "tls"}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, "tls_q", 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive: %d, %v", len(ds), err)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}

	for name, co := range map[string]jetstream.ConnectOptions{
		"wrong password": {TLS: cfg, User: "berth", Password: secret + "x"},
		"untrusted cert": {TLS: &tls.Config{MinVersion: tls.VersionTLS12}, User: "berth", Password: secret},
		"no credentials": {TLS: cfg},
	} {
		b, err := jetstream.Connect(ctx, url, co, testOpts)
		if err == nil {
			b.Close()
			t.Errorf("%s: connected", name)
			continue
		}
		if !errors.Is(err, sdk.ErrUnavailable) {
			t.Errorf("%s: %v, want ErrUnavailable", name, err)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the error repeats the password: %v", name, err)
		}
	}
}
