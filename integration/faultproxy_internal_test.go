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
	var once sync.Once
	proxyDialed = func(p *Proxy) { once.Do(func() { p.Refuse(true); p.Reset() }) }
	t.Cleanup(func() { proxyDialed = nil })
	p := StartProxy(t, echoServer(t))
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

// TestProxyFreezeOpenHoldsAConnectionBeingSetUp: a FreezeOpen that runs
// while the proxy dials the target for a connection it accepted holds that
// connection too, until Thaw. Before, it was registered after the
// FreezeOpen as a new connection and its bytes flowed: a test that froze
// the open connections (pause's hang test) could see one of them answer.
func TestProxyFreezeOpenHoldsAConnectionBeingSetUp(t *testing.T) {
	var once sync.Once
	proxyDialed = func(p *Proxy) { once.Do(p.FreezeOpen) }
	t.Cleanup(func() { proxyDialed = nil })
	p := StartProxy(t, echoServer(t))
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	// Held bytes never come; 300 ms is ample for an echo on loopback that
	// is not held (the old code answered in microseconds).
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	var b [1]byte
	if n, err := c.Read(b[:]); err == nil {
		t.Fatalf("read %q through a connection frozen while it was set up", b[:n])
	} else if ne := net.Error(nil); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read: %v, want a timeout (held, not closed)", err)
	}
	p.Thaw()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second)) // a guard against a hang, not a timing
	if _, err := io.ReadFull(c, b[:]); err != nil || b[0] != 'x' {
		t.Fatalf("after Thaw: read %q, %v; want the held echo", b[:], err)
	}
	// A connection opened after the FreezeOpen's set-up passes at once.
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	p.FreezeOpen() // holds c and c2, both open now
	p.Thaw()
	_ = c2.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c2.Write([]byte("y")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c2, b[:]); err != nil || b[0] != 'y' {
		t.Fatalf("after FreezeOpen and Thaw: read %q, %v; want the echo", b[:], err)
	}
}
