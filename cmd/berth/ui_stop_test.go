package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/internal/syncbuf"
	"github.com/berthq/berth/sdk"
)

// slowRedrive is a memory broker whose redrive waits for release, and which
// records a Close that comes while a redrive is under way.
type slowRedrive struct {
	*memory.Broker
	entered, release chan struct{}
	redriving        atomic.Bool
	closedMidway     atomic.Bool
	closed           atomic.Bool
}

func (s *slowRedrive) RedriveDeadLetters(ctx context.Context, queue string, ids ...string) (int, error) {
	s.redriving.Store(true)
	defer s.redriving.Store(false)
	close(s.entered)
	<-s.release
	return s.Broker.RedriveDeadLetters(ctx, queue, ids...)
}

func (s *slowRedrive) Close() error {
	s.closedMidway.Store(s.redriving.Load())
	s.closed.Store(true)
	return nil
}

// berth ui stopped (Ctrl-C) while a redrive from the dashboard is moving a
// page waits for that page before it closes the broker, so that the page is
// moved whole and logged. Before, it closed the broker 5 s after the
// interrupt whatever the requests in hand were doing.
func TestUIStopWaitsForTheRedriveInHand(t *testing.T) {
	defer func(g time.Duration) { uiShutdownGrace = g }(uiShutdownGrace)
	uiShutdownGrace = 10 * time.Millisecond
	b, ids := deadLettered(t, 2)
	sb := &slowRedrive{Broker: b, entered: make(chan struct{}), release: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr := make(chan string, 1)
	stderr := &syncbuf.Buffer{}
	e := env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: stderr, getenv: func(string) string { return "" },
		open:      func(context.Context, string) (sdk.Broker, error) { return sb, nil },
		listening: func(a string) { addr <- a }}
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"ui", "-url", "mem://", "-addr", "127.0.0.1:0"}, e) }()
	var a string
	select {
	case a = <-addr:
	case code := <-done:
		t.Fatalf("ui exited %d: %s", code, stderr.String())
	}
	posted := make(chan struct{})
	go func() {
		defer close(posted)
		form := url.Values{"id": {ids[0]}, "limit": {"1"}}
		req, _ := http.NewRequest("POST", "http://"+a+"/queues/billing/redrive", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		if resp, err := http.DefaultClient.Do(req); err == nil { // the stop may cut the answer
			resp.Body.Close()
		}
	}()
	<-sb.entered
	cancel() // Ctrl-C, with the redrive's page in hand
	// Until the page is moved, ui either waits (saying so) or, as before,
	// has already closed the broker and returned.
	for !strings.Contains(stderr.String(), "still running") && !sb.closed.Load() {
		time.Sleep(5 * time.Millisecond)
	}
	close(sb.release)
	code := <-done
	<-posted
	if sb.closedMidway.Load() {
		t.Fatalf("the broker was closed while a redrive was moving its page (exit %d):\n%s", code, stderr.String())
	}
	if !sb.closed.Load() || code != exitOK {
		t.Fatalf("ui: exit %d, broker closed %v:\n%s", code, sb.closed.Load(), stderr.String())
	}
	if st := stats(t, b); st.DeadLettered != 1 {
		t.Errorf("the redrive in hand was not finished: %d dead letters, want 1", st.DeadLettered)
	}
	if !strings.Contains(stderr.String(), "dead letters changed") {
		t.Errorf("the redrive in hand was not logged:\n%s", stderr.String())
	}
}

// berth ui closes a keep-alive connection left idle: before, it kept it for
// ever, so that anyone who could reach the address, token or not, could
// hold connections until the process ran out of files.
func TestUIClosesIdleConnections(t *testing.T) {
	defer func(d time.Duration) { uiIdleTimeout = d }(uiIdleTimeout)
	uiIdleTimeout = 50 * time.Millisecond
	b, _ := deadLettered(t, 1)
	e := env{open: func(context.Context, string) (sdk.Broker, error) { return nopClose{b}, nil }}
	addr, _ := startUI(t, e, "-addr", "127.0.0.1:0", "-url", "mem://")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /api/queues HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Close {
		t.Fatalf("GET: %d, close %v", resp.StatusCode, resp.Close)
	}
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second)) // far past the 50ms idle bound
	if _, err := r.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("an idle connection was not closed by the server: %v", err)
	}
}
