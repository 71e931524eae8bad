package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/internal/syncbuf"
	"github.com/berthq/berth/sdk"
)

// uiRun starts berth ui with args and returns its address, its stderr, and
// stop, which interrupts it (Ctrl-C) and returns its exit code.
func uiRun(t *testing.T, e env, args ...string) (string, *syncbuf.Buffer, func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	stderr := &syncbuf.Buffer{}
	e.stdin, e.stdout, e.stderr = strings.NewReader(""), io.Discard, stderr
	if e.getenv == nil {
		e.getenv = func(string) string { return "" }
	}
	e.listening = func(a string) { addr <- a }
	done := make(chan int, 1)
	go func() { done <- run(ctx, append([]string{"ui"}, args...), e) }()
	var once sync.Once
	code := 0
	stop := func() int {
		once.Do(func() {
			cancel()
			code = <-done
		})
		return code
	}
	t.Cleanup(func() { stop() })
	select {
	case a := <-addr:
		return a, stderr, stop
	case c := <-done:
		once.Do(func() { cancel(); code = c })
		t.Fatalf("ui exited %d: %s", c, stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("ui did not start")
	}
	return "", nil, nil
}

// fakeClock is a clock that moves only when told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// failHandshake opens a connection to addr, sends bytes that are not TLS,
// and reads until the server has closed it: net/http logs the failed
// handshake before it closes the connection.
func failHandshake(t *testing.T, addr string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "hello, this is not TLS\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second)) // a safety net, not a bound asserted
	_, _ = io.Copy(io.Discard, conn)
}

// berth ui -tls-cert -tls-key logs the first failed TLS handshake, then
// counts them and logs at most one line a minute with the count, and the
// count left when it stops. Before, each one (a port scan, a TCP health
// check, plain HTTP to the HTTPS port) was a WARN line of its own.
func TestUIHandshakeErrorsSummarised(t *testing.T) {
	defer func(now func() time.Time) { uiNow = now }(uiNow)
	clk := &fakeClock{t: time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)}
	uiNow = clk.now
	certFile, keyFile, _ := selfSigned(t)
	b, _ := deadLettered(t, 1)
	e := env{open: func(context.Context, string) (sdk.Broker, error) { return nopClose{b}, nil }}
	addr, stderr, stop := uiRun(t, e, "-addr", "127.0.0.1:0", "-url", "mem://", "-tls-cert", certFile, "-tls-key", keyFile)
	lines := func() []string {
		var out []string
		for _, l := range strings.Split(stderr.String(), "\n") {
			if strings.Contains(l, "TLS handshake error") {
				out = append(out, l)
			}
		}
		return out
	}
	for range 25 {
		failHandshake(t, addr)
	}
	if l := lines(); len(l) != 1 || !strings.Contains(l[0], "first record does not look like a TLS handshake") || !strings.Contains(l[0], "level=WARN") {
		t.Fatalf("25 failed handshakes within a minute: %d lines, want the first alone:\n%s", len(l), strings.Join(l, "\n"))
	}
	clk.add(61 * time.Second)
	failHandshake(t, addr)
	if l := lines(); len(l) != 2 || !strings.Contains(l[1], "25 TLS handshake errors since 2026-12-03T09:00:00Z") || !strings.Contains(l[1], "the latest from 127.0.0.1:") {
		t.Fatalf("a minute later: want one summary line of 25:\n%s", strings.Join(l, "\n"))
	}
	for range 3 {
		failHandshake(t, addr)
	}
	if l := lines(); len(l) != 2 {
		t.Fatalf("3 more within the minute: want no line:\n%s", strings.Join(l, "\n"))
	}
	if code := stop(); code != exitOK {
		t.Fatalf("ui exited %d: %s", code, stderr.String())
	}
	if l := lines(); len(l) != 3 || !strings.Contains(l[2], "3 TLS handshake errors since 2026-12-03T09:01:01Z") {
		t.Fatalf("at the stop: want the 3 counted:\n%s", strings.Join(l, "\n"))
	}
}

// The server's other errors are still logged, each one, between failed
// handshakes that are not.
func TestUIErrorLogKeepsOtherErrors(t *testing.T) {
	var out bytes.Buffer
	clk := &fakeClock{t: time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)}
	l := &uiErrorLog{log: log.New(&out, "", 0), now: clk.now, every: time.Minute}
	srvLog := log.New(l, "", 0)
	for range 3 {
		srvLog.Printf("http: TLS handshake error from 10.0.0.1:4242: EOF")
		srvLog.Printf("http: superfluous response.WriteHeader call")
	}
	l.flush()
	got := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{"http: TLS handshake error from 10.0.0.1:4242: EOF (more are counted, and logged at most once every 1m0s)",
		"http: superfluous response.WriteHeader call", "http: superfluous response.WriteHeader call", "http: superfluous response.WriteHeader call",
		"http: 2 TLS handshake errors since 2026-12-03T09:00:00Z (port scans, health checks, plain HTTP to the HTTPS port), the latest from 10.0.0.1:4242: EOF"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("logged:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// berth ui stopped (Ctrl-C) with a browser's connections open but no
// request in hand (one idle after a request, one opened ahead on which
// nothing was sent) closes them and exits without saying requests were
// running. Before, the connection opened ahead held the stop for the
// whole grace (net/http counts one busy for its first 5 s), which then
// printed "requests still running".
func TestUIStopClosesConnectionsWithoutRequests(t *testing.T) {
	defer func(g time.Duration) { uiShutdownGrace = g }(uiShutdownGrace)
	uiShutdownGrace = time.Second // below net/http's 5 s for a new connection
	b, _ := deadLettered(t, 1)
	e := env{open: func(context.Context, string) (sdk.Broker, error) { return nopClose{b}, nil }}
	addr, stderr, stop := uiRun(t, e, "-addr", "127.0.0.1:0", "-url", "mem://")
	ahead, err := net.Dial("tcp", addr) // accepted before the next one is answered
	if err != nil {
		t.Fatal(err)
	}
	defer ahead.Close()
	used, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer used.Close()
	if _, err := io.WriteString(used, "GET /api/queues HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(used)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("GET: %d, close %v", resp.StatusCode, resp.Close)
	}
	if code := stop(); code != exitOK {
		t.Fatalf("ui exited %d: %s", code, stderr.String())
	}
	if s := stderr.String(); strings.Contains(s, "still running") {
		t.Errorf("no request was in hand, yet:\n%s", s)
	}
	_ = ahead.SetReadDeadline(time.Now().Add(30 * time.Second)) // a safety net, not a bound asserted
	_ = used.SetReadDeadline(time.Now().Add(30 * time.Second))
	for name, c := range map[string]io.Reader{"opened ahead": ahead, "idle": r} {
		if _, err := io.ReadAll(c); err != nil && !errors.Is(err, net.ErrClosed) && !isReset(err) {
			t.Errorf("the %s connection was not closed: %v", name, err)
		}
	}
}

// isReset reports whether err is a connection reset by the peer.
func isReset(err error) bool { return err != nil && strings.Contains(err.Error(), "connection reset") }
