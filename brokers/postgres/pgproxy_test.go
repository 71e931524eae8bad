package postgres_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pgProxy is a TCP proxy to PostgreSQL for faults integration.Proxy does
// not make, because they depend on what the connection carries:
//
//   - cutListens: a connection is closed as soon as the server's reply to a
//     LISTEN (its CommandComplete "LISTEN" and the ReadyForQuery after it)
//     has been passed to the client: a server, or a balancer in front of
//     it, that accepts the LISTEN and drops the connection at once;
//   - dropCancels: cancel requests are dropped unseen by the server, as
//     when the network that lost a connection loses the cancel too.
//
// reset closes the connections of listening clients, or all of them.
type pgProxy struct {
	ln          net.Listener
	target      string
	cutListens  atomic.Bool
	dropCancels atomic.Bool
	cuts        atomic.Int64  // LISTENs cut
	mark        []byte        // looked for in what a listening connection receives
	marked      chan struct{} // closed once a listening connection passed mark
	once        sync.Once

	mu    sync.Mutex
	conns map[net.Conn]bool // the open connections: true for a listening client's
	wg    sync.WaitGroup
}

var (
	listenDone = []byte("C\x00\x00\x00\x0bLISTEN\x00")
	readyIdle  = []byte("Z\x00\x00\x00\x05I")
)

// cancelRequestCode opens a CancelRequest, after its length (16).
const cancelRequestCode = 80877102

// startPGProxy starts a pgProxy to target (host:port), passing everything;
// mark is looked for in what the server sends on a listening connection
// (a notification's payload). It is closed when the test ends.
func startPGProxy(t *testing.T, target string, mark string) *pgProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &pgProxy{ln: ln, target: target, conns: map[net.Conn]bool{},
		mark: []byte(mark), marked: make(chan struct{})}
	c.wg.Add(1)
	go c.accept()
	t.Cleanup(c.close)
	return c
}

func (c *pgProxy) accept() {
	defer c.wg.Done()
	for {
		client, err := c.ln.Accept()
		if err != nil {
			return
		}
		c.mu.Lock()
		c.conns[client] = false
		c.mu.Unlock()
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.serve(client)
		}()
	}
}

// serve proxies one client: its first message (startup, SSL or cancel
// request) says which.
func (c *pgProxy) serve(client net.Conn) {
	defer c.drop(client)
	head := make([]byte, 8)
	if _, err := io.ReadFull(client, head); err != nil {
		return
	}
	if binary.BigEndian.Uint32(head[4:]) == cancelRequestCode && c.dropCancels.Load() {
		return
	}
	server, err := net.DialTimeout("tcp", c.target, 5*time.Second)
	if err != nil {
		return
	}
	c.mu.Lock()
	c.conns[server] = false
	c.mu.Unlock()
	defer c.drop(server)
	if _, err := server.Write(head); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(server, client)
		c.drop(client, server)
	}()
	c.replies(client, server)
	c.drop(client, server)
	<-done
}

// replies copies the server's bytes to the client, and returns after a
// LISTEN's reply when cutting them.
func (c *pgProxy) replies(client, server net.Conn) {
	var seen []byte // the replies since the last complete LISTEN reply looked for
	listening := false
	buf := make([]byte, 32<<10)
	for {
		n, err := server.Read(buf)
		if n > 0 {
			if _, werr := client.Write(buf[:n]); werr != nil {
				return
			}
			if listening && len(c.mark) > 0 && bytes.Contains(buf[:n], c.mark) {
				c.once.Do(func() { close(c.marked) })
			}
			seen = append(seen, buf[:n]...)
			if i := bytes.Index(seen, listenDone); i >= 0 {
				if bytes.Contains(seen[i:], readyIdle) {
					seen, listening = nil, true
					c.mu.Lock()
					if _, open := c.conns[client]; open {
						c.conns[client] = true
					}
					c.mu.Unlock()
					if c.cutListens.Load() {
						c.cuts.Add(1)
						return
					}
				}
			} else if len(seen) > len(listenDone) {
				seen = seen[len(seen)-len(listenDone):]
			}
		}
		if err != nil {
			return
		}
	}
}

func (c *pgProxy) drop(conns ...net.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range conns {
		_ = conn.Close()
		delete(c.conns, conn)
	}
}

// reset closes the listening clients' connections, or every connection
// with all.
func (c *pgProxy) reset(all bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for conn, listening := range c.conns {
		if listening || all {
			_ = conn.Close()
		}
	}
}

func (c *pgProxy) close() {
	_ = c.ln.Close()
	c.reset(true)
	c.wg.Wait()
}
