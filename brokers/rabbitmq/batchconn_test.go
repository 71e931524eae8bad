package rabbitmq

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
)

// gateConn is a net.Conn whose writes wait for the test to open a gate, and
// which records what it was given, and its Close, in order.
type gateConn struct {
	net.Conn // nil: only Write and Close are used

	mu      sync.Mutex
	events  []string      // each write's bytes, and "<close>"
	gate    chan struct{} // one receive lets one write through; closed: all
	entered chan struct{} // a write has started
	shut    chan struct{} // closed by Close: a waiting write fails, as on a socket
	once    sync.Once
	fail    error
	closes  int
}

func newGateConn() *gateConn {
	return &gateConn{gate: make(chan struct{}), entered: make(chan struct{}, 1000), shut: make(chan struct{})}
}

func (g *gateConn) Write(p []byte) (int, error) {
	g.entered <- struct{}{}
	select {
	case <-g.gate:
	case <-g.shut:
		return 0, net.ErrClosed
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.fail != nil {
		return 0, g.fail
	}
	g.events = append(g.events, string(p))
	return len(p), nil
}

func (g *gateConn) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closes++
	g.events = append(g.events, "<close>")
	g.once.Do(func() { close(g.shut) })
	return nil
}

func (g *gateConn) got() ([]string, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.events...), g.closes
}

// waitFor waits for a receive from ch, failing the test with what after
// berthtest.WaitTimeout.
func waitFor[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(berthtest.WaitTimeout):
		t.Fatal(what)
	}
}

func waitEntered(t *testing.T, g *gateConn) {
	t.Helper()
	waitFor(t, g.entered, "the writer did not start a write")
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
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	events, closes := g.got()
	if want := []string{"a", "bcd", "<close>"}; fmt.Sprint(events) != fmt.Sprint(want) || closes != 1 {
		t.Errorf("socket saw %q, closed %d times; want %q, once", events, closes, want)
	}
	if _, err := b.Write([]byte("e")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Write after Close: %v, want net.ErrClosed", err)
	}
}

// TestBatchConnCloseDrains: Close waits for what is buffered to reach the
// socket before it closes it (amqp091's last frames, connection.close-ok).
func TestBatchConnCloseDrains(t *testing.T) {
	g := newGateConn()
	b := newBatchConn(g)
	if _, err := b.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	waitEntered(t, g) // "x" held in the socket write
	if _, err := b.Write([]byte("y")); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(50 * time.Millisecond) // Close is waiting by now, well within closeDrain
		close(g.gate)
	}()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if events, _ := g.got(); fmt.Sprint(events) != fmt.Sprint([]string{"x", "y", "<close>"}) {
		t.Errorf("socket saw %q, want [x y <close>]", events)
	}
}

// TestBatchConnCloseWithStuckWrite: a socket write that never completes
// holds Close for closeDrain at most; closing the socket then ends the
// write and the writer goroutine (goleak checks it is gone).
func TestBatchConnCloseWithStuckWrite(t *testing.T) {
	g := newGateConn() // the gate never opens
	b := newBatchConn(g)
	if _, err := b.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	waitEntered(t, g)
	start := time.Now()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < closeDrain {
		t.Errorf("Close returned after %v, before the drain bound %v with a write under way", took, closeDrain)
	}
	waitFor(t, b.done, "the writer goroutine did not exit after Close")
}

// TestBatchConnWriteErrorIsSticky: a failed socket write closes the socket
// (so the AMQP reader fails and every pending confirm with it) and every
// later Write returns the error; nothing waits forever.
func TestBatchConnWriteErrorIsSticky(t *testing.T) {
	g := newGateConn()
	g.fail = io.ErrClosedPipe
	close(g.gate)
	b := newBatchConn(g)
	if _, err := b.Write([]byte("a")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(berthtest.WaitTimeout)
	var err error
	for err == nil && time.Now().Before(deadline) {
		_, err = b.Write([]byte("b"))
		time.Sleep(time.Millisecond)
	}
	if !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("Write after a failed socket write: %v, want %v", err, io.ErrClosedPipe)
	}
	waitFor(t, b.done, "the writer goroutine did not exit after the failed write") // the writer closes the socket, then exits
	if _, closes := g.got(); closes != 1 {
		t.Errorf("socket closed %d times after the failure, want 1", closes)
	}
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
	// Fill the buffer.
	if _, err := b.Write(make([]byte, maxBatchPending)); err != nil {
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
	close(g.gate) // "a" done: the buffer goes to the socket, space frees
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(berthtest.WaitTimeout):
		t.Fatal("Write still waiting after the socket took the buffer")
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	events, _ := g.got()
	if got, want := len(strings.Join(events, ""))-len("<close>"), 1+maxBatchPending+1; got != want {
		t.Errorf("socket got %d bytes, want %d", got, want)
	}
}

// TestBatchConnBurstKeepsBytes: after a burst that grew the buffer past the
// bound (many small frames behind a slow socket), later frames still reach
// the socket exactly once and in order: the buffers swapped between Write
// and the writer are never shared. (They were: the frame after a burst was
// overwritten by the next one while the socket wrote it, and sent twice.)
func TestBatchConnBurstKeepsBytes(t *testing.T) {
	g := newGateConn()
	b := newBatchConn(g)
	var want bytes.Buffer
	write := func(p []byte) {
		want.Write(p)
		if _, err := b.Write(p); err != nil {
			t.Error(err)
		}
	}
	write([]byte("x"))
	waitEntered(t, g) // the socket holds "x"
	for i := range 256 {
		write(bytes.Repeat([]byte{byte('A' + i%26)}, 4096)) // 1 MiB in 4 KiB frames: capacity past the bound
	}
	done := make(chan struct{})
	go func() { // waits for space until the writer takes the burst
		defer close(done)
		write([]byte("abc"))
	}()
	g.gate <- struct{}{} // "x" written
	waitEntered(t, g)    // the socket holds the burst
	<-done               // "abc" buffered meanwhile
	g.gate <- struct{}{} // the burst written
	waitEntered(t, g)    // the socket holds "abc"
	write([]byte("XYZ")) // buffered while "abc" is being written
	close(g.gate)
	for i := range 50 {
		write(fmt.Appendf(nil, "<%d>", i))
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	events, _ := g.got()
	got := strings.TrimSuffix(strings.Join(events, ""), "<close>")
	if w := want.String(); got != w {
		i := 0
		for i < min(len(got), len(w)) && got[i] == w[i] {
			i++
		}
		t.Errorf("socket got %d bytes, %d written; they differ from byte %d: %q, want %q",
			len(got), len(w), i, got[i:min(len(got), i+12)], w[i:min(len(w), i+12)])
	}
}

// TestBatchConnConcurrentWritersOverTCP: many goroutines writing frames
// through a real loopback connection, as amqp091's channels do; each frame
// arrives whole, exactly once, and each writer's frames in its order.
func TestBatchConnConcurrentWritersOverTCP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const writers, frames = 16, 2000
	type result struct {
		seen map[int]int // writer -> frames read
		err  error
	}
	res := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			res <- result{err: err}
			return
		}
		defer c.Close()
		seen := map[int]int{}
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			var w, seq int
			if _, err := fmt.Sscanf(sc.Text(), "%d:%d", &w, &seq); err != nil {
				res <- result{err: fmt.Errorf("frame %q: %w", sc.Text(), err)}
				return
			}
			if seq != seen[w] {
				res <- result{err: fmt.Errorf("writer %d: frame %d after %d frames", w, seq, seen[w])}
				return
			}
			seen[w]++
		}
		res <- result{seen: seen, err: sc.Err()}
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b := newBatchConn(raw)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for seq := range frames {
				if _, err := b.Write(fmt.Appendf(nil, "%d:%d\n", w, seq)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-res:
		if r.err != nil {
			t.Fatal(r.err)
		}
		for w := range writers {
			if r.seen[w] != frames {
				t.Errorf("writer %d: %d frames arrived, want %d", w, r.seen[w], frames)
			}
		}
	case <-time.After(berthtest.WaitTimeout):
		t.Fatal("the reader did not finish")
	}
}
