package integration

import (
	"context"
	"errors"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP fault proxy on loopback between clients and one server:
// it adds latency and a bandwidth cap, resets connections, freezes them
// (half-open: open but silent, as a dead peer or a dropped route leaves)
// and refuses new ones. Point a client at Addr instead of the server.
//
// It is berth's own rather than toxiproxy's library: toxiproxy's module
// embeds its HTTP API server and metrics stack, and the four faults the
// scenarios need fit in this file.
type Proxy struct {
	ln     net.Listener
	target string

	mu        sync.Mutex
	conns     map[*link]struct{}
	latency   time.Duration
	bandwidth int // bytes per second per direction; 0: unlimited
	refuse    bool
	frozen    bool
	replies   bool          // frozen: only the server-to-client direction
	thaw      chan struct{} // closed and replaced by Thaw
	closed    bool
	// resets counts the calls of Reset: a connection accepted before one
	// and registered after (its dial to the target under way) is reset
	// too, as an open one is.
	resets int
	// events numbers the calls of FreezeOpen and Thaw; frozeAt and thawedAt
	// are the numbers of the last of each. A connection accepted before a
	// FreezeOpen and registered after it, with no Thaw since, is held too,
	// as an open one is.
	events, frozeAt, thawedAt uint64
	wg                        sync.WaitGroup
}

// link is one proxied connection: the client's side and the server's.
type link struct {
	client, server net.Conn
	once           sync.Once
	dead           chan struct{} // closed by reset
	held           bool          // frozen by FreezeOpen; under Proxy.mu
}

// NewProxy listens on a free loopback port and forwards to target
// (host:port). Close stops it.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[*link]struct{}{}, thaw: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// StartProxy is NewProxy for a test: the proxy is closed when the test ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	p, err := NewProxy(target)
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// ProxyURL starts a proxy (StartProxy) to the host of rawURL, a broker or
// database URL, and returns the URL with its host replaced by the proxy's,
// and the proxy: a client given it connects through the proxy, which can
// then cut, freeze or slow its connections.
func ProxyURL(t testing.TB, rawURL string) (*url.URL, *Proxy) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatalf("parse %q: %v", rawURL, err)
	}
	p := StartProxy(t, u.Host)
	u.Host = p.Addr()
	return u, p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetLatency delays every chunk of bytes by d in each direction (0: none).
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// SetBandwidth caps each direction of each connection to bytesPerSecond
// (0: unlimited).
func (p *Proxy) SetBandwidth(bytesPerSecond int) {
	p.mu.Lock()
	p.bandwidth = bytesPerSecond
	p.mu.Unlock()
}

// Reset closes every open connection with a TCP reset, both sides, as a
// failing router or a restarted load balancer would. New connections pass.
func (p *Proxy) Reset() {
	p.mu.Lock()
	p.resets++
	links := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.reset()
	}
}

// Refuse makes the proxy close new connections at once (true) or pass them
// again (false); open connections are not touched.
func (p *Proxy) Refuse(refuse bool) {
	p.mu.Lock()
	p.refuse = refuse
	p.mu.Unlock()
}

// Freeze holds every byte in both directions of every connection, open or
// new, without closing any: half-open connections. Thaw lets them flow again.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	p.frozen = true
	p.mu.Unlock()
}

// FreezeOpen holds every byte of the connections open now, without closing
// any, while new connections pass: a database primary paused or a route
// black-holed after a failover, which a client's fresh connection gets
// around. Thaw ends it.
func (p *Proxy) FreezeOpen() {
	p.mu.Lock()
	p.events++
	p.frozeAt = p.events
	for l := range p.conns {
		l.held = true
	}
	p.mu.Unlock()
}

// FreezeReplies holds every byte from the server to its clients while
// requests still reach the server: a server's answer (a publisher confirm,
// a commit's reply, an HTTP response) lost after the server acted. Thaw
// ends it.
func (p *Proxy) FreezeReplies() {
	p.mu.Lock()
	p.frozen, p.replies = true, true
	p.mu.Unlock()
}

// Thaw ends a Freeze, FreezeOpen or FreezeReplies; held bytes are
// delivered.
func (p *Proxy) Thaw() {
	p.mu.Lock()
	p.events++
	p.thawedAt = p.events
	for l := range p.conns {
		l.held = false
	}
	p.frozen, p.replies = false, false
	close(p.thaw)
	p.thaw = make(chan struct{})
	p.mu.Unlock()
}

// Close stops listening, resets every connection and waits for the
// proxy's goroutines to end. It is idempotent.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.mu.Unlock()
	_ = p.ln.Close()
	p.Thaw()
	p.Reset()
	p.wg.Wait()
}

func (l *link) reset() {
	l.once.Do(func() { close(l.dead) })
	for _, c := range []net.Conn{l.client, l.server} {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // close sends RST, not FIN
		}
		_ = c.Close()
	}
}

// proxyDialed, when set (by this package's tests only), runs in a
// connection's set-up between its dial to the target and its registration.
var proxyDialed func(*Proxy)

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse, closed, resets, events := p.refuse, p.closed, p.resets, p.events
		p.mu.Unlock()
		if refuse || closed {
			_ = c.Close()
			continue
		}
		// Each connection is set up on its own, so that the next is taken
		// at once: one left in the listen backlog while this one's dial
		// runs is open for its client already, yet its snapshot of resets
		// and events, taken only once it is accepted, would miss a Reset
		// or FreezeOpen made meanwhile.
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.serve(c, resets, events)
		}()
	}
}

// serve sets up and runs the link of c, a client connection accepted when
// the proxy had counted resets Resets and events FreezeOpen and Thaw calls.
func (p *Proxy) serve(c net.Conn, resets int, events uint64) {
	s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		_ = c.Close()
		return
	}
	if proxyDialed != nil {
		proxyDialed(p)
	}
	l := &link{client: c, server: s, dead: make(chan struct{})}
	p.mu.Lock()
	if p.resets != resets || p.closed {
		// Reset (or Close) ran while this connection was being set up:
		// the client had it open, so it is reset too. Before, it
		// survived, and a test that took the server away (Refuse,
		// then Reset) kept a working connection.
		p.mu.Unlock()
		l.reset()
		return
	}
	// A FreezeOpen that ran meanwhile, not yet thawed, holds it: the
	// client had it open then. Before, it passed as a new one.
	l.held = p.frozeAt > events && p.frozeAt > p.thawedAt
	p.conns[l] = struct{}{}
	p.mu.Unlock()
	var dirs sync.WaitGroup
	dirs.Go(func() { p.pipe(l, s, c) })
	dirs.Go(func() { p.pipe(l, c, s) })
	dirs.Wait()
	p.mu.Lock()
	delete(p.conns, l)
	p.mu.Unlock()
}

// chunk is bytes read from one side, due for the other at a time.
type chunk struct {
	data []byte
	due  time.Time
}

// pipe copies src to dst through a queue, so that latency delays each
// chunk from the moment it was read, not from the previous write.
func (p *Proxy) pipe(l *link, dst, src net.Conn) {
	queue := make(chan chunk, 256)
	var writer sync.WaitGroup
	writer.Go(func() {
		defer l.reset() // a failed write ends both directions
		for ch := range queue {
			if wait := time.Until(ch.due); wait > 0 {
				time.Sleep(wait)
			}
			if !p.waitThawed(l, src == l.server) {
				return
			}
			if _, err := dst.Write(ch.data); err != nil {
				return
			}
			p.mu.Lock()
			bw := p.bandwidth
			p.mu.Unlock()
			if bw > 0 {
				time.Sleep(time.Duration(len(ch.data)) * time.Second / time.Duration(bw))
			}
		}
	})
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			lat := p.latency
			p.mu.Unlock()
			queue <- chunk{data: append([]byte(nil), buf[:n]...), due: time.Now().Add(lat)}
		}
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				// EOF or reset from src: pass the end on once the queue is written.
				close(queue)
				writer.Wait()
				l.reset()
				return
			}
			break
		}
	}
	close(queue)
	writer.Wait()
}

// waitThawed blocks while the proxy is frozen; false when the proxy was
// closed or the link reset.
func (p *Proxy) waitThawed(l *link, reply bool) bool {
	for {
		p.mu.Lock()
		frozen, thaw, closed := p.frozen && (reply || !p.replies) || l.held, p.thaw, p.closed
		p.mu.Unlock()
		if closed {
			return false
		}
		if !frozen {
			return true
		}
		select {
		case <-thaw:
		case <-l.dead:
			return false
		}
	}
}

// TwoSilentHosts starts two [SilentServer]s, as the primary and the standby
// of a multi-host connection string cut off by the network, and returns
// them as "first,second" (host:port each), a dial function for the
// driver (a plain dial) and a channel it closes once the second is dialled:
// the connect to the first has then run out of its time.
func TwoSilentHosts(t testing.TB) (hosts string, dial func(ctx context.Context, network, addr string) (net.Conn, error), dialedSecond <-chan struct{}) {
	t.Helper()
	first, second := SilentServer(t), SilentServer(t)
	dialed := make(chan struct{})
	var once sync.Once
	dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil && addr == second {
			once.Do(func() { close(dialed) })
		}
		return c, err
	}
	return first + "," + second, dial, dialed
}

// SilentServer listens on loopback, takes every connection and never
// answers nor closes one until the test ends: a broker or database that
// hangs (the connect succeeds, no reply ever comes). It returns its
// address.
func SilentServer(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}
