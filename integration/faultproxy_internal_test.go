package integration

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// TestProxyResetReachesAConnectionBeingSetUp: a Reset that runs while the
// proxy dials the target for a connection it accepted resets that
// connection too. Before, it was registered after the Reset and survived:
// TestReadinessFollowsPostgres (package health), which takes the database
// away with Refuse then Reset, failed when its pool opened a connection at
// that moment, its Worker still receiving through it.
func TestProxyResetReachesAConnectionBeingSetUp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var echoes sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); echoes.Wait() })
	echoes.Go(func() { // an echo server: one connection
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	})
	var once sync.Once
	proxyDialed = func(p *Proxy) { once.Do(func() { p.Refuse(true); p.Reset() }) }
	t.Cleanup(func() { proxyDialed = nil })
	p := StartProxy(t, ln.Addr().String())
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		// The reset came before the dial returned (loopback is that fast):
		// the connection did not survive either.
		t.Logf("dial: %v", err)
		return
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second)) // a guard against a hang, not a timing
	_, _ = c.Write([]byte("x"))
	var b [1]byte
	n, err := c.Read(b[:])
	if err == nil {
		t.Fatalf("read %q through a connection the proxy was resetting: it survived the Reset", b[:n])
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("read: %v: the connection neither answered nor closed", err)
	}
}
