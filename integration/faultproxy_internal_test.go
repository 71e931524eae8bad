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
	heldUntilThaw(t, p, c, 'x', "a connection frozen while it was set up")
	// A connection opened after the FreezeOpen's set-up passes at once.
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	p.FreezeOpen() // holds c, and c2 whether open or still being set up
	p.Thaw()
	_ = c2.SetDeadline(time.Now().Add(10 * time.Second)) // a guard against a hang, not a timing
	if err := roundTrip(c2, []byte("y")); err != nil {
		t.Fatalf("after FreezeOpen and Thaw: %v; want the echo", err)
	}
	// A connection opened after a FreezeOpen, not thawed, passes: only the
	// connections open then are held.
	p.FreezeOpen()
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	_ = c3.SetDeadline(time.Now().Add(10 * time.Second))
	if err := roundTrip(c3, []byte("z")); err != nil {
		t.Fatalf("a connection opened after FreezeOpen: %v; want the echo", err)
	}
}

// TestProxyFreezeOpenHoldsAConnectionWaitingToBeAccepted: a connection its
// client has open (the handshake done, in the listen backlog) while the
// proxy sets up another is held by a FreezeOpen made then, as an open one
// is. Before, the accept loop set connections up one at a time: the waiting
// one was taken only after the FreezeOpen and passed as a new one.
func TestProxyFreezeOpenHoldsAConnectionWaitingToBeAccepted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dialed := make(chan struct{}, 2) // a dial of the proxy to the target
	var served sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); served.Wait() })
	served.Go(func() { // an echo server that reports each connection
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			dialed <- struct{}{}
			served.Go(func() { _, _ = io.Copy(c, c) })
		}
	})
	c2 := make(chan net.Conn, 1)
	var once sync.Once
	proxyDialed = func(p *Proxy) {
		once.Do(func() { // the first connection's set-up
			c, err := net.Dial("tcp", p.Addr()) // open for its client now
			if err != nil {
				t.Error(err)
				close(c2)
				return
			}
			<-dialed // the first connection's dial
			select {
			case <-dialed: // the second one accepted, its set-up under way
			case <-time.After(10 * time.Second): // a guard, not a measure: the old loop never takes it
				t.Error("the proxy did not take the second connection while it set up the first")
			}
			p.FreezeOpen()
			c2 <- c
		})
	}
	t.Cleanup(func() { proxyDialed = nil })
	p := StartProxy(t, ln.Addr().String())
	c1, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	c, ok := <-c2
	if !ok {
		t.FailNow()
	}
	defer c.Close()
	heldUntilThaw(t, p, c, 'y', "a connection open before the FreezeOpen")
}

// heldUntilThaw writes one byte to c, a connection to p's echo server, and
// checks that its echo is held (not answered, not closed) until p.Thaw.
func heldUntilThaw(t *testing.T, p *Proxy, c net.Conn, x byte, what string) {
	t.Helper()
	if _, err := c.Write([]byte{x}); err != nil {
		t.Fatal(err)
	}
	// Held bytes never come; 300 ms is ample for an echo on loopback that
	// is not held (the old code answered in microseconds).
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	var b [1]byte
	if n, err := c.Read(b[:]); err == nil {
		t.Fatalf("read %q through %s", b[:n], what)
	} else if ne := net.Error(nil); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read: %v, want a timeout (held, not closed)", err)
	}
	p.Thaw()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second)) // a guard against a hang, not a timing
	if _, err := io.ReadFull(c, b[:]); err != nil || b[0] != x {
		t.Fatalf("after Thaw: read %q, %v; want the held echo %q", b[:], err, x)
	}
}
