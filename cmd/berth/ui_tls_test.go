package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// selfSigned writes a self-signed certificate for 127.0.0.1 and localhost
// and its key as PEM files in a temporary directory, and returns their
// paths and a pool that trusts the certificate.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "berth ui test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
		IsCA:         true,

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
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "ui.crt"), filepath.Join(dir, "ui.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// berth ui -tls-cert -tls-key serves HTTPS with them: a client that trusts
// the certificate reaches the dashboard, the token is still required, and
// every answer, the 401 too, still carries the security headers, and over
// TLS HSTS (Strict-Transport-Security) as well. A plain
// HTTP request gets no page. On loopback it does not warn.
func TestUIServesHTTPS(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t)
	b, _ := deadLettered(t, 1)
	e := env{
		open:   func(context.Context, string) (sdk.Broker, error) { return nopClose{b}, nil },
		getenv: func(k string) string { return map[string]string{"BERTH_UI_TOKEN": uiTestToken}[k] },
	}
	addr, stderr := startUI(t, e, "-addr", "127.0.0.1:0", "-url", "mem://", "-tls-cert", certFile, "-tls-key", keyFile)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	get := func(token string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "https://"+addr+"/queues/billing", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.TLS == nil || len(resp.TLS.PeerCertificates) == 0 {
			t.Fatal("the answer did not come over TLS")
		}
		return resp, string(body)
	}
	for _, c := range []struct {
		token  string
		status int
	}{{"", http.StatusUnauthorized}, {"wrong", http.StatusUnauthorized}, {uiTestToken, http.StatusOK}} {
		resp, body := get(c.token)
		if resp.StatusCode != c.status {
			t.Errorf("token %q: %d, want %d: %s", c.token, resp.StatusCode, c.status, body)
		}
		for k, want := range map[string]string{"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store",
			"Strict-Transport-Security": "max-age=31536000"} {
			if got := resp.Header.Get(k); got != want {
				t.Errorf("token %q: %s %q, want %q", c.token, k, got, want)
			}
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("token %q: Content-Security-Policy %q", c.token, csp)
		}
		if c.status == http.StatusOK && !strings.Contains(body, "Dead letters of billing") {
			t.Errorf("with the token: not the queue's page:\n%s", body)
		}
	}
	// Plain HTTP to the HTTPS port: no page.
	resp, err := http.Get("http://" + addr + "/queues/billing")
	if err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || strings.Contains(string(body), "Dead letters") {
			t.Errorf("plain HTTP was answered: %d %s", resp.StatusCode, body)
		}
	}
	// A client that does not trust the certificate gets no page either.
	if resp, err := http.Get("https://" + addr + "/queues/billing"); err == nil {
		resp.Body.Close()
		t.Errorf("a client that does not trust the certificate got %d", resp.StatusCode)
	}
	if s := stderr.String(); !strings.Contains(s, "serving https://127.0.0.1:") || strings.Contains(s, "WARNING") {
		t.Errorf("stderr: %s", s)
	}
}

// -tls-cert and -tls-key go together, and files that cannot be read, or a
// key that is not the certificate's, are a clear error: each before the
// broker is opened and before anything listens.
func TestUITLSFlags(t *testing.T) {
	certFile, keyFile, _ := selfSigned(t)
	otherCert, otherKey, _ := selfSigned(t)
	missing := filepath.Join(t.TempDir(), "missing.pem")
	b, _ := deadLettered(t, 1)
	opened := false
	e := env{open: func(context.Context, string) (sdk.Broker, error) {
		opened = true
		return nopClose{b}, nil
	}}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-tls-cert", certFile}, exitUsage, "-tls-cert needs -tls-key"},
		{[]string{"-tls-key", keyFile}, exitUsage, "-tls-key needs -tls-cert"},
		{[]string{"-tls-cert", missing, "-tls-key", keyFile}, exitError, "missing.pem: no such file"},
		{[]string{"-tls-cert", certFile, "-tls-key", missing}, exitError, "missing.pem: no such file"},
		{[]string{"-tls-cert", keyFile, "-tls-key", certFile}, exitError, "-tls-cert"},
		{[]string{"-tls-cert", certFile, "-tls-key", otherKey}, exitError, "private key does not match"},
		{[]string{"-tls-cert", otherCert, "-tls-key", keyFile}, exitError, "private key does not match"},
	} {
		args := append([]string{"ui", "-url", "mem://", "-addr", "127.0.0.1:0"}, c.args...)
		r := berthEnv(t, context.Background(), b, e, args...)
		if r.code != c.code || !strings.Contains(r.err, c.want) {
			t.Errorf("%v: exit %d, want %d with %q: %s", c.args, r.code, c.code, c.want, r.err)
		}
	}
	if opened {
		t.Error("bad TLS flags opened the broker")
	}
}

// berth ui on an address other than loopback without TLS warns, on
// stderr, that the token and the pages cross the network in clear text;
// with -tls-cert and -tls-key, or on loopback, it does not.
func TestUIWarnsWithoutTLSOffLoopback(t *testing.T) {
	certFile, keyFile, _ := selfSigned(t)
	b, _ := deadLettered(t, 1)
	e := env{
		open:   func(context.Context, string) (sdk.Broker, error) { return nopClose{b}, nil },
		getenv: func(k string) string { return map[string]string{"BERTH_UI_TOKEN": uiTestToken}[k] },
	}
	for _, c := range []struct {
		args []string
		warn bool
	}{
		{[]string{"-addr", "0.0.0.0:0"}, true},
		{[]string{"-addr", "0.0.0.0:0", "-tls-cert", certFile, "-tls-key", keyFile}, false},
		{[]string{"-addr", "127.0.0.1:0"}, false},
	} {
		_, stderr := startUI(t, e, append([]string{"-url", "mem://"}, c.args...)...)
		s := stderr.String()
		if warned := strings.Contains(s, "WARNING") && strings.Contains(s, "without TLS") && strings.Contains(s, "-tls-cert"); warned != c.warn {
			t.Errorf("%v: warned %v, want %v:\n%s", c.args, warned, c.warn, s)
		}
	}
}
