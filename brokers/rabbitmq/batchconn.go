package rabbitmq

import (
	"net"
	"sync"
	"time"
)

// batchConn coalesces the writes of one AMQP connection into as few system
// calls as the load allows. amqp091 flushes its buffered writer once per
// published message, holding the connection's send lock through the write
// system call: 256 concurrent publishers made 256 write calls, queued one
// behind the other, and the server as many reads. Here Write only appends to
// a buffer and wakes the connection's writer goroutine, which writes
// everything appended since its last write in one call: idle, a frame goes
// out at once (one goroutine hand-off later); under load, frames that
// arrive during a write share the next one.
//
// Nothing is acknowledged by a write: a publish counts only when its confirm
// comes back, an ack only when the server applies it. A write error is
// sticky: the writer closes the socket, so amqp091's reader sees the
// connection fail and fails every pending confirm, and later writes return
// the error. Buffered bytes are bounded (maxBatchPending): beyond that Write
// waits, as it would on a full socket buffer. Write returning therefore does
// not mean the bytes reached the socket; [batchConn.sync] waits until they
// did (Options.SyncAck).
type batchConn struct {
	net.Conn

	mu      sync.Mutex
	data    sync.Cond // signalled when buf gains bytes or the conn closes
	space   sync.Cond // broadcast when a write completes or fails
	buf     []byte    // appended by Write, not yet handed to the socket
	spare   []byte    // the writer's previous buffer, reused
	err     error     // the first write error: every later Write returns it
	closing bool      // Close was called: the writer drains buf and stops
	queued  uint64    // bytes Write has accepted, in all
	written uint64    // bytes the writer has written to the socket, in all
	done    chan struct{}
	closed  sync.Once
}

// maxBatchPending bounds the bytes Write buffers ahead of the socket.
const maxBatchPending = 1 << 20

// closeDrain bounds how long Close waits for the writer to hand pending
// frames (connection.close, most often) to the socket.
const closeDrain = 250 * time.Millisecond

func newBatchConn(c net.Conn) *batchConn {
	b := &batchConn{Conn: c, done: make(chan struct{})}
	b.data.L = &b.mu
	b.space.L = &b.mu
	go b.run()
	return b
}

// Write buffers p for the writer goroutine and returns; it blocks only while
// maxBatchPending bytes wait.
func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.err == nil && !b.closing && len(b.buf) >= maxBatchPending {
		b.space.Wait()
	}
	if b.err != nil {
		return 0, b.err
	}
	if b.closing {
		return 0, net.ErrClosed
	}
	if len(b.buf) == 0 {
		b.data.Signal()
	}
	b.buf = append(b.buf, p...)
	b.queued += uint64(len(p))
	return len(p), nil
}

// sync returns once every byte Write accepted before the call has been
// written to the socket (the socket's Write returned: the bytes are the
// kernel's to send, and a process that dies now does not take them with it),
// or with the write error that lost them. It waits for the writer as long as
// the writer waits for the socket: on a frozen connection, until the
// heartbeat closes it.
func (b *batchConn) sync() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	target := b.queued
	for b.written < target && b.err == nil {
		b.space.Wait()
	}
	if b.written >= target {
		return nil
	}
	return b.err
}

// run writes what Write buffered until the conn closes or a write fails.
func (b *batchConn) run() {
	defer close(b.done)
	b.mu.Lock()
	for {
		for len(b.buf) == 0 && !b.closing {
			b.data.Wait()
		}
		if len(b.buf) == 0 { // closing, everything written
			b.mu.Unlock()
			return
		}
		// Swap buffers: Write appends to the spare while out is written.
		// The spare's array now belongs to buf alone, so spare lets go of
		// it; out becomes the next spare once written (unless a burst grew
		// it past the bound: then the next swap allocates afresh).
		out := b.buf
		b.buf, b.spare = b.spare[:0], nil
		b.mu.Unlock()
		n, err := b.Conn.Write(out)
		b.mu.Lock()
		b.written += uint64(n)
		if cap(out) <= maxBatchPending {
			b.spare = out[:0]
		}
		if err != nil {
			b.err = err
			b.buf = nil
			b.space.Broadcast()
			b.mu.Unlock()
			b.closeSocket() // amqp091's reader fails with it: the connection is lost
			return
		}
		b.space.Broadcast()
	}
}

// Close lets the writer hand what is buffered to the socket (for at most
// closeDrain), then closes the socket.
func (b *batchConn) Close() error {
	b.mu.Lock()
	b.closing = true
	b.data.Signal()
	b.space.Broadcast()
	b.mu.Unlock()
	t := time.NewTimer(closeDrain)
	select {
	case <-b.done:
	case <-t.C:
	}
	t.Stop()
	return b.closeSocket()
}

// closeSocket closes the socket once; a second call returns nil.
func (b *batchConn) closeSocket() error {
	var err error
	b.closed.Do(func() { err = b.Conn.Close() })
	return err
}
