package rabbitmq

import (
	"crypto/tls"
	"net"
	"net/url"
	"sync"
	"testing"

	"github.com/berthq/berth/integration"
)

// proxy is a TCP proxy to the RabbitMQ server that a test can cut: Cut
// closes every connection through it, as a network failure would, and
// Refuse makes it drop new connections until allowed again.
type proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	conns  map[net.Conn]bool
	refuse bool
	frozen map[net.Conn]bool // conns whose bytes are held, as a half-open connection would
	thaw   chan struct{}     // closed and replaced by Thaw
	wg     sync.WaitGroup
}

func newProxy(t testing.TB, rawURL string) (*proxy, string) {
	t.Helper()
	return newTLSProxy(t, rawURL, nil)
}

// newTLSProxy is newProxy with the proxy's side speaking TLS with cfg (nil:
// plain TCP), so that amqps:// can be tested against a plain server. The
// returned URL has the scheme amqps when cfg is set.
func newTLSProxy(t testing.TB, rawURL string, cfg *tls.Config) (*proxy, string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatalf("parse URL: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	if cfg != nil {
		ln = tls.NewListener(ln, cfg)
		u.Scheme = "amqps"
	}
	target := u.Host
	if u.Port() == "" {
		target = net.JoinHostPort(u.Hostname(), "5672")
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]bool{}, frozen: map[net.Conn]bool{}, thaw: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	u.Host = ln.Addr().String()
	return p, u.String()
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse := p.refuse
		p.mu.Unlock()
		if refuse {
			_ = c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[s] = true, true
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, s)
		go p.pipe(s, c)
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.waitThawed(src) {
				break
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// Freeze holds every byte of the connections open now, in both directions,
// without closing them: a half-open connection, as a dead peer or a
// dropped route leaves. New connections pass.
func (p *proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		p.frozen[c] = true
	}
}

// Thaw lets frozen connections go on.
func (p *proxy) Thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.frozen)
	close(p.thaw)
	p.thaw = make(chan struct{})
}

// waitThawed blocks while src is frozen; false when the connection was
// closed meanwhile.
func (p *proxy) waitThawed(src net.Conn) bool {
	for {
		p.mu.Lock()
		frozen, open, thaw := p.frozen[src], p.conns[src], p.thaw
		p.mu.Unlock()
		if !open {
			return false
		}
		if !frozen {
			return true
		}
		<-thaw
	}
}

// Cut closes every connection through the proxy.
func (p *proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
	// Wake frozen pipes: their connections are closed now.
	clear(p.frozen)
	close(p.thaw)
	p.thaw = make(chan struct{})
}

// Refuse makes the proxy drop new connections (true) or accept them again.
func (p *proxy) Refuse(on bool) {
	p.mu.Lock()
	p.refuse = on
	p.mu.Unlock()
}

func (p *proxy) close() {
	_ = p.ln.Close()
	p.Cut()
	p.Thaw()
	p.wg.Wait()
}

// startFaultProxy starts an integration.Proxy (freezable per direction) in
// front of the server of rawURL and returns it with the URL that goes
// through it; it is closed when the test ends.
func startFaultProxy(t testing.TB, rawURL string) (*integration.Proxy, string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatalf("parse URL: %v", err)
	}
	target := u.Host
	if u.Port() == "" {
		target = net.JoinHostPort(u.Hostname(), "5672")
	}
	p := integration.StartProxy(t, target)
	u.Host = p.Addr()
	return p, u.String()
}
