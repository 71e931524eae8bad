package main

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/internal/syncbuf"
	"github.com/berthq/berth/sdk"
)

// closeWatch is a memory broker that counts the Stats calls it answers and
// those that come after its Close, or that its Close cut.
type closeWatch struct {
	*memory.Broker
	closed          atomic.Bool
	calls, afterUse atomic.Int64
}

func (c *closeWatch) Stats(ctx context.Context, queue string) (sdk.QueueStats, error) {
	if c.closed.Load() {
		c.afterUse.Add(1)
	}
	c.calls.Add(1)
	time.Sleep(time.Millisecond) // a broker call takes a while
	st, err := c.Broker.Stats(ctx, queue)
	if c.closed.Load() {
		c.afterUse.Add(1)
	}
	return st, err
}

func (c *closeWatch) Close() error {
	c.closed.Store(true)
	return nil
}

// TestUIStopWithHTTP2RequestsComing: with -tls-cert and -tls-key berth ui
// speaks HTTP/2, whose connections run each request's handler on a
// goroutine of their own; after the server's Close (requests in hand
// outlived the grace) such a goroutine, started for a request read before,
// may run only once berth ui has begun to wait for the requests in hand.
// They were counted with a sync.WaitGroup: that late request made an Add
// from zero while the stop was in Wait, which WaitGroup forbids (the race
// detector reports it; without it, a panic "WaitGroup is reused before
// previous Wait has returned", or a handler using the broker after its
// Close). Now a request that comes once the wait has begun is turned away.
// Stopped a number of times under a steady stream of requests, berth ui
// exits 0 and never uses the broker after closing it.
func TestUIStopWithHTTP2RequestsComing(t *testing.T) {
	defer func(g time.Duration) { uiShutdownGrace = g }(uiShutdownGrace)
	uiShutdownGrace = 2 * time.Millisecond // the stop reaches the server's Close
	certFile, keyFile, pool := selfSigned(t)
	var answered atomic.Int64
	for i := range 40 {
		b, _ := deadLettered(t, 1)
		cw := &closeWatch{Broker: b}
		ctx, cancel := context.WithCancel(context.Background())
		addr := make(chan string, 1)
		stderr := &syncbuf.Buffer{}
		e := env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: stderr, getenv: func(string) string { return "" },
			open:      func(context.Context, string) (sdk.Broker, error) { return cw, nil },
			listening: func(a string) { addr <- a }}
		done := make(chan int, 1)
		go func() {
			done <- run(ctx, []string{"ui", "-url", "mem://", "-addr", "127.0.0.1:0", "-tls-cert", certFile, "-tls-key", keyFile}, e)
		}()
		var a string
		select {
		case a = <-addr:
		case code := <-done:
			cancel()
			t.Fatalf("ui exited %d: %s", code, stderr.String())
		}
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
		client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					resp, err := client.Get("https://" + a + "/api/queues")
					if err != nil {
						continue // the stop cuts it
					}
					if resp.StatusCode == http.StatusOK {
						answered.Add(1)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
		}
		for cw.calls.Load() < 8 { // requests are coming
			time.Sleep(time.Millisecond)
		}
		cancel()
		code := <-done
		close(stop)
		wg.Wait()
		tr.CloseIdleConnections()
		if code != exitOK {
			t.Fatalf("stop %d: ui exited %d: %s", i, code, stderr.String())
		}
		if n := cw.afterUse.Load(); n > 0 {
			t.Fatalf("stop %d: the broker was used %d times after its Close", i, n)
		}
	}
	if answered.Load() == 0 {
		t.Fatal("no request was answered")
	}
}

// requestGate waits for the requests in hand and turns away those that
// come once it has begun to.
func TestRequestGate(t *testing.T) {
	var g requestGate
	if !g.enter() {
		t.Fatal("a request before the stop was turned away")
	}
	stopped := make(chan struct{})
	go func() {
		g.stopAndWait()
		close(stopped)
	}()
	for { // until the stop has begun
		g.mu.Lock()
		s := g.stopped
		g.mu.Unlock()
		if s {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if g.enter() {
		t.Fatal("a request after the stop began was let in")
	}
	select {
	case <-stopped:
		t.Fatal("the stop did not wait for the request in hand")
	default:
	}
	g.leave()
	<-stopped
	var idle requestGate
	idle.stopAndWait() // none in hand: returns at once
	if idle.enter() {
		t.Fatal("a request after the stop was let in")
	}
}
