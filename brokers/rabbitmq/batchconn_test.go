package rabbitmq

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
)

// gateConn is a net.Conn whose writes wait for the test to open a gate, and
// which records each write it was given.
type gateConn struct {
	net.Conn // nil: only Write and Close are used

	mu      sync.Mutex
	writes  [][]byte
	gate    chan struct{} // one receive lets one write through
	entered chan struct{} // a write has started
	fail    error
	closes  int
}

func newGateConn() *gateConn {
	return &gateConn{gate: make(chan struct{}), entered: make(chan struct{}, 100)}
}

func (g *gateConn) Write(p []byte) (int, error) {
	g.entered <- struct{}{}
	<-g.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.fail != nil {
		return 0, g.fail
	}
	g.writes = append(g.writes, bytes.Clone(p))
	return len(p), nil
}

func (g *gateConn) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closes++
	return nil
}

func (g *gateConn) got() ([][]byte, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([][]byte(nil), g.writes...), g.closes
}

func waitEntered(t *testing.T, g *gateConn) {
	t.Helper()
	select {
	case <-g.entered:
	case <-time.After(berthtest.WaitTimeout):
		t.Fatal("the writer did not start a write")
	}
}

// TestBatchConnCoalesces: frames written while the socket write is under
// way go out together in the next write, in order, and nothing is lost.
func TestBatchConnCoalesces(t *testing.T) {
	g := newGateConn()
	b := newBatchConn(g)
	if _, err := b.Write([]byte("a")); err != nil {
		t.Fatal(err)
	}
	waitEntered(t, g) // "a" is in the socket write, held at the gate
	for _, s := range []string{"b", "c", "d"} {
		if n, err := b.Write([]byte(s)); n != 1 || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	g.gate <- struct{}{} // "a" done
	waitEntered(t, g)    // the next write: everything buffered meanwhile
	g.gate <- struct{}{}
	close(g.gate) // Close's drain finds nothing to write
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	writes, closes := g.got()
	if len(writes) != 2 || string(writes[0]) != "a" || string(writes[1]) != "bcd" {
		t.Errorf("socket writes %q, want [a bcd]", writes)
	}
	if closes != 1 {
		t.Errorf("socket closed %d times, want 1", closes)
	}
	if _, err := b.Write([]byte("e")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Write after Close: %v, want net.ErrClosed", err)
	}
}

// TestBatchConnCloseDrains: Close hands what is buffered to the socket
// before it closes it (amqp091's connection.close frame is written last).
func TestBatchConnCloseDrains(t *testing.T) {
	g := newGateConn()
	close(g.gate)
	b := newBatchConn(g)
	for _, s := range []string{"x", "y"} {
		if _, err := b.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	writes, closes := g.got()
	if got := string(bytes.Join(writes, nil)); got != "xy" || closes != 1 {
		t.Errorf("wrote %q and closed %d times, want \"xy\" and once", got, closes)
	}
}

// TestBatchConnWriteErrorIsSticky: a failed socket write closes the socket
// (so the AMQP reader fails and every pending confirm with it) and every
// later Write returns the error; nothing waits forever.
func TestBatchConnWriteErrorIsSticky(t *testing.T) {
	g := newGateConn()
	g.fail = io.ErrClosedPipe
	b := newBatchConn(g)
	if _, err := b.Write([]byte("a")); err != nil {
		t.Fatal(err)
	}
	waitEntered(t, g)
	g.gate <- struct{}{}
	deadline := time.Now().Add(berthtest.WaitTimeout)
	var err error
	for err == nil && time.Now().Before(deadline) {
		_, err = b.Write([]byte("b"))
		time.Sleep(time.Millisecond)
	}
	if !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("Write after a failed socket write: %v, want %v", err, io.ErrClosedPipe)
	}
	if _, closes := g.got(); closes != 1 {
		t.Errorf("socket closed %d times after the failure, want 1", closes)
	}
	close(g.gate)
	if err := b.Close(); err != nil {
		t.Errorf("Close after the failure: %v", err)
	}
	if _, closes := g.got(); closes != 1 {
		t.Errorf("socket closed %d times in all, want 1", closes)
	}
}

// TestBatchConnBoundsBuffer: while the socket does not take bytes, Write
// buffers at most maxBatchPending and then waits; the waiting Write goes on
// once the socket write completes.
func TestBatchConnBoundsBuffer(t *testing.T) {
	g := newGateConn()
	b := newBatchConn(g)
	if _, err := b.Write([]byte("a")); err != nil {
		t.Fatal(err)
	}
	waitEntered(t, g) // the socket holds "a"
	big := make([]byte, maxBatchPending)
	if _, err := b.Write(big); err != nil { // fills the buffer
		t.Fatal(err)
	}
	wrote := make(chan error, 1)
	go func() {
		_, err := b.Write([]byte("c"))
		wrote <- err
	}()
	select {
	case err := <-wrote:
		t.Fatalf("Write returned (%v) with %d bytes already buffered", err, maxBatchPending)
	case <-time.After(100 * time.Millisecond):
	}
	g.gate <- struct{}{} // "a" done: the buffer goes to the socket, space frees
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(berthtest.WaitTimeout):
		t.Fatal("Write still waiting after the socket took the buffer")
	}
	close(g.gate)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	writes, _ := g.got()
	var n int
	for _, w := range writes {
		n += len(w)
	}
	if want := 1 + maxBatchPending + 1; n != want {
		t.Errorf("socket got %d bytes, want %d", n, want)
	}
}
