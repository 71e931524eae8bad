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
//   - fatalAfter: on a connection that is not listening, the first
//     ReadyForQuery after a given server reply (a CommandComplete) is
//     replaced by a FATAL ErrorResponse (57P01, administrator command) and
//     the connection closed: the server ended the session after the
//     statement committed, before it said it was ready. It is disarmed
//     once used;
//   - holdRequests: what the clients connected now send is held (and their
//     connections to the server kept open when they close) until
//     releaseRequests passes it: a request delayed on the network while
//     its client gave up.
//
// reset closes the connections of listening clients, or all of them.
type pgProxy struct {
	ln          net.Listener
	target      string
	cutListens  atomic.Bool
	dropCancels atomic.Bool
	cuts        atomic.Int64 // LISTENs cut
	fatalAfter  atomic.Pointer[[]byte]
	fatals      atomic.Int64  // FATALs sent for fatalAfter
	mark        []byte        // looked for in what a listening connection receives
	marked      chan struct{} // closed once a listening connection passed mark
	once        sync.Once

	mu    sync.Mutex
	conns map[net.Conn]bool      // the open connections: true for a listening client's
	reqs  map[net.Conn]*reqState // by client connection
	quit  chan struct{}          // closed by close
	wg    sync.WaitGroup
}

var (
	listenDone = []byte("C\x00\x00\x00\x0bLISTEN\x00")
	readyIdle  = []byte("Z\x00\x00\x00\x05I")
)

// fatalAdminShutdown is the ErrorResponse of a server that terminates the
// session: FATAL, 57P01.
var fatalAdminShutdown = func() []byte {
	fields := "SFATAL\x00VFATAL\x00C57P01\x00Mterminating connection due to administrator command\x00\x00"
	msg := []byte{'E', 0, 0, 0, 0}
	binary.BigEndian.PutUint32(msg[1:], uint32(4+len(fields)))
	return append(msg, fields...)
}()

// commandComplete is the CommandComplete message of tag.
func commandComplete(tag string) []byte {
	msg := []byte{'C', 0, 0, 0, 0}
	binary.BigEndian.PutUint32(msg[1:], uint32(4+len(tag)+1))
	return append(append(msg, tag...), 0)
}

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
	c := &pgProxy{ln: ln, target: target, conns: map[net.Conn]bool{}, reqs: map[net.Conn]*reqState{}, quit: make(chan struct{}),
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
	st := &reqState{server: server, released: make(chan struct{})}
	c.mu.Lock()
	c.reqs[client] = st
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.reqs, client)
		c.mu.Unlock()
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if c.requests(st, client) {
			c.drop(client, server)
		} else {
			c.drop(client) // the server's reply to what was held closes it
		}
	}()
	c.replies(client, server)
	c.drop(client, server)
	<-done
}

// reqState is a client's stream of requests to the server.
type reqState struct {
	server   net.Conn
	released chan struct{} // closed by releaseRequests

	mu      sync.Mutex
	holding bool   // set by holdRequests
	held    []byte // what the client sent while holding
}

// requests copies the client's bytes to the server, holding them while
// st.holding. It reports whether the server connection may be closed: a
// client that closed while its requests were held leaves it open, so that
// the server runs what was held when it is released.
func (c *pgProxy) requests(st *reqState, client net.Conn) bool {
	buf := make([]byte, 32<<10)
	for {
		n, err := client.Read(buf)
		st.mu.Lock()
		if st.holding {
			st.held = append(st.held, buf[:n]...)
			st.mu.Unlock()
			if err != nil {
				select {
				case <-st.released:
				case <-c.quit:
				}
				return false
			}
			continue
		}
		st.mu.Unlock()
		if n > 0 {
			if _, werr := st.server.Write(buf[:n]); werr != nil {
				return true
			}
		}
		if err != nil {
			return true
		}
	}
}

// holdRequests holds what the clients connected now send (new clients
// are not held), until releaseRequests.
func (c *pgProxy) holdRequests() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.reqs {
		st.mu.Lock()
		st.holding = true
		st.mu.Unlock()
	}
}

// releaseRequests passes what was held to the server, in order, and stops
// holding.
func (c *pgProxy) releaseRequests() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.reqs {
		st.mu.Lock()
		if st.holding {
			_, _ = st.server.Write(st.held)
			st.held, st.holding = nil, false
			close(st.released)
		}
		st.mu.Unlock()
	}
}

// replies copies the server's bytes to the client, and returns after a
// LISTEN's reply when cutting them.
func (c *pgProxy) replies(client, server net.Conn) {
	var seen []byte // the replies since the last complete LISTEN reply looked for
	listening := false
	var held []byte // what fatalAfter holds back, up to a ReadyForQuery
	buf := make([]byte, 32<<10)
	for {
		n, err := server.Read(buf)
		if pat := c.fatalAfter.Load(); (pat != nil || len(held) > 0) && !listening {
			held = append(held, buf[:n]...)
			if pat != nil {
				if i := bytes.Index(held, *pat); i >= 0 {
					if j := bytes.Index(held[i:], readyIdle); j >= 0 && c.fatalAfter.CompareAndSwap(pat, nil) {
						_, _ = client.Write(held[:i+j])
						_, _ = client.Write(fatalAdminShutdown)
						c.fatals.Add(1)
						return
					}
					if err != nil {
						return
					}
					continue // the ReadyForQuery is still to come
				}
			}
			// Pass what ends with a ReadyForQuery: the reply of a
			// statement that is not the one looked for.
			if k := bytes.LastIndex(held, readyIdle); k >= 0 || pat == nil {
				end := len(held)
				if pat != nil {
					end = k + len(readyIdle)
				}
				if _, werr := client.Write(held[:end]); werr != nil {
					return
				}
				held = append([]byte(nil), held[end:]...)
			}
			if err != nil {
				return
			}
			continue
		}
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
	close(c.quit)
	c.reset(true)
	c.wg.Wait()
}
