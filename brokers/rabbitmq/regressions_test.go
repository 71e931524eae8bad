package rabbitmq

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// Regression tests of the review of this package: each failed on the code
// before its fix.

// TestReturnMatchedToItsPublish: two publishes of one message ID in flight
// on the shared confirm channel, the first routed to a quorum queue, the
// second unroutable. The return must fail the second, not the first (the
// outbox relay can publish one message to two queues). Matched by ID alone,
// the first failed with UnroutableError and the second was reported
// confirmed, though the server had dropped it.
func TestReturnMatchedToItsPublish(t *testing.T) {
	url := serverURL(t)
	q := testQueue(t, url)
	missing := testQueue(t, url) // never declared
	b := newBroker(t, url, Options{Logger: quiet, NoDeclare: true})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	var ue *UnroutableError
	for i := range 20 {
		id := sdk.NewID()
		r1, err := b.PublishAsync(ctx, q, &sdk.Message{ID: id, Type: "t", Body: []byte("routed")})
		if err != nil {
			t.Fatal(err)
		}
		r2, err := b.PublishAsync(ctx, missing, &sdk.Message{ID: id, Type: "t", Body: []byte("unroutable")})
		if err != nil {
			t.Fatal(err)
		}
		if e1, e2 := r1.Wait(ctx), r2.Wait(ctx); e1 != nil || !errors.As(e2, &ue) {
			t.Fatalf("round %d: routed publish -> %v (want nil); unroutable publish -> %v (want *UnroutableError)", i, e1, e2)
		}
		if ue.RoutingKey != missing {
			t.Fatalf("round %d: UnroutableError names %q, want %q", i, ue.RoutingKey, missing)
		}
	}
	// The same through Publish, pipelined in one batch of two queues' worth:
	// one Publish per queue, concurrently.
	for i := range 10 {
		id := sdk.NewID()
		errc := make(chan error, 1)
		go func() { errc <- b.Publish(ctx, missing, &sdk.Message{ID: id, Type: "t"}) }()
		e1 := b.Publish(ctx, q, &sdk.Message{ID: id, Type: "t"})
		e2 := <-errc
		if e1 != nil || !errors.As(e2, &ue) {
			t.Fatalf("Publish round %d: routed -> %v (want nil); unroutable -> %v (want *UnroutableError)", i, e1, e2)
		}
	}
	info, err := b.Info(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if info.Ready != 30 {
		t.Errorf("queue holds %d messages, want the 30 routed ones", info.Ready)
	}
}

// TestCloseTimeoutBoundsEveryConsumer: Close waits for the hand-back of
// every consumer within one CloseTimeout, however many consumers there
// are. With one timer shared by the consumers, the second was waited for
// without bound (until UnavailableAfter let it go: 30s here).
func TestCloseTimeoutBoundsEveryConsumer(t *testing.T) {
	url := serverURL(t)
	p, purl := newProxy(t, url)
	qs := []string{testQueue(t, url), testQueue(t, url), testQueue(t, url)}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	b, err := New(ctx, purl, Options{Logger: quiet, CloseTimeout: time.Second, UnavailableAfter: 30 * time.Second, MoveDelaysUpTo: -1})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		rctx, rcancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, _ = b.Receive(rctx, q, 1) // starts the consumer
		rcancel()
	}
	p.Refuse(true)
	p.Cut()
	time.Sleep(500 * time.Millisecond) // the consumers are reconnecting
	done := make(chan struct{})
	start := time.Now()
	go func() { _ = b.Close(); close(done) }()
	select {
	case <-done:
		t.Logf("Close took %s with CloseTimeout 1s and %d consumers", time.Since(start), len(qs))
	case <-time.After(10 * time.Second): // generous: CloseTimeout is 1s
		t.Fatalf("Close still waiting after 10s with CloseTimeout 1s")
	}
}

// cutOnMarker returns the URL of a proxy to target that cuts a connection
// (both ways, as a network failure would) as soon as the client sends a
// frame containing marker.
func cutOnMarker(t *testing.T, target string, marker []byte) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			go func() { _, _ = io.Copy(c, s); _ = c.Close(); _ = s.Close() }()
			go func() {
				defer c.Close()
				defer s.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						if bytes.Contains(buf[:n], marker) {
							return
						}
						if _, werr := s.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return "amqp://guest:guest@" + ln.Addr().String() + "/"
}

// TestDeclareCutIsUnavailable: a connection lost while Publish or
// PublishAsync declares the queue fails the call with an error wrapping
// sdk.ErrUnavailable (retry), keeping amqp091's error in the chain. It
// came back as a bare *amqp.Error (501 "EOF").
func TestDeclareCutIsUnavailable(t *testing.T) {
	url := serverURL(t)
	for name, publish := range map[string]func(context.Context, *Broker, string) error{
		"Publish": func(ctx context.Context, b *Broker, q string) error {
			return b.Publish(ctx, q, &sdk.Message{Type: "t"})
		},
		"PublishAsync": func(ctx context.Context, b *Broker, q string) error {
			_, err := b.PublishAsync(ctx, q, &sdk.Message{Type: "t"})
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			q := testQueue(t, url)
			purl := cutOnMarker(t, "127.0.0.1:5672", []byte(DeadLetterQueue(q)))
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			b, err := New(ctx, purl, Options{Logger: quiet, MoveDelaysUpTo: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			err = publish(ctx, b, q)
			t.Logf("%s: %v", name, err)
			if !errors.Is(err, sdk.ErrUnavailable) {
				t.Fatalf("%s cut during its declaration: %v; want an error wrapping sdk.ErrUnavailable", name, err)
			}
			var ae *amqp.Error
			if !errors.As(err, &ae) {
				t.Errorf("%s: %v; want amqp091's *amqp.Error kept in the chain", name, err)
			}
		})
	}
}

// TestForgedDeliveryCountIgnored: an x-delivery-count header set by a
// producer outside berth does not count attempts. It made the first
// delivery Attempt() 101, so the Worker dead-lettered the message at its
// first transient failure. A real redelivery still counts: the server's
// count on a quorum queue (which overwrites the producer's), the
// redelivered flag on a classic one.
func TestForgedDeliveryCountIgnored(t *testing.T) {
	url := serverURL(t)
	for _, qt := range []QueueType{Classic, Quorum} {
		t.Run(string(qt), func(t *testing.T) {
			q := testQueue(t, url)
			b := newBroker(t, url, Options{Logger: quiet, QueueType: qt, Prefetch: 1, MoveDelaysUpTo: -1})
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			if err := b.DeclareQueue(ctx, q); err != nil {
				t.Fatal(err)
			}
			ch := ownChannel(t, url, false)
			forge := func(n int32) {
				t.Helper()
				if err := ch.PublishWithContext(ctx, "", q, false, false, amqp.Publishing{
					MessageId: sdk.NewID(), Type: "t", Headers: amqp.Table{"x-delivery-count": n}}); err != nil {
					t.Fatal(err)
				}
			}
			// Delivered, abandoned (as by a crash), delivered again.
			forge(100)
			for want := 1; want <= 2; want++ {
				ds, err := b.Receive(ctx, q, 1)
				if err != nil {
					t.Fatal(err)
				}
				if got := ds[0].Attempt(); got != want {
					t.Errorf("delivery %d of a message with a forged x-delivery-count 100: Attempt() %d, want %d", want, got, want)
				}
				if want == 1 {
					ds[0].(*delivery).abandon()
				} else if err := ds[0].Ack(ctx); err != nil {
					t.Fatal(err)
				}
			}
			forge(-5)
			ds, err := b.Receive(ctx, q, 1)
			if err != nil {
				t.Fatal(err)
			}
			if got := ds[0].Attempt(); got != 1 {
				t.Errorf("first delivery of a message with a forged x-delivery-count -5: Attempt() %d, want 1", got)
			}
			_ = ds[0].Ack(ctx)
		})
	}
}

// The child process of TestSyncAckSurvivesCrash: it acks one delivery with
// SyncAck and SIGKILLs itself as soon as Ack returns.
const syncAckChildEnv = "BERTH_RMQ_SYNCACK_CHILD"

func init() {
	q := os.Getenv(syncAckChildEnv)
	if q == "" {
		return
	}
	ctx := context.Background()
	b, err := New(ctx, os.Getenv(helperURL), Options{SyncAck: true, Prefetch: 1, Logger: quiet, MoveDelaysUpTo: -1})
	if err != nil {
		os.Exit(2)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil {
		os.Exit(3)
	}
	if err := ds[0].Ack(ctx); err != nil {
		os.Exit(4)
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

// TestSyncAckSurvivesCrash: with SyncAck, a process killed right after Ack
// returns has not lost the ack. Ack used to return with the frame only in
// batchConn's buffer, and nearly every one was lost.
func TestSyncAckSurvivesCrash(t *testing.T) {
	url := serverURL(t)
	q := testQueue(t, url)
	b := newBroker(t, url, Options{Logger: quiet, MoveDelaysUpTo: -1})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	const n = 10
	for range n {
		if err := b.Publish(ctx, q, &sdk.Message{Type: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), syncAckChildEnv+"="+q, helperURL+"="+url)
		_ = cmd.Run()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
			t.Fatalf("child %d: %v (want killed by its own SIGKILL after Ack)", i, cmd.ProcessState)
		}
	}
	// A lost ack shows as its message back in the queue once the server has
	// seen the connection go: give it time to, failing at the first one.
	deadline := time.Now().Add(2 * time.Second)
	for {
		info, err := b.Info(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if info.Ready > 0 {
			t.Fatalf("%d of %d messages acked with SyncAck are back in the queue after their process died", info.Ready, n)
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestBatchConnSyncWaitsForTheSocket: sync returns only once what was
// written before it has been handed to the socket, and with the write
// error when the socket failed.
func TestBatchConnSyncWaitsForTheSocket(t *testing.T) {
	g := newGateConn()
	b := newBatchConn(g)
	defer b.Close()
	if _, err := b.Write([]byte("ack")); err != nil {
		t.Fatal(err)
	}
	waitEntered(t, g) // held at the gate
	done := make(chan error, 1)
	go func() { done <- b.sync() }()
	select {
	case err := <-done:
		t.Fatalf("sync returned %v before the socket write", err)
	case <-time.After(50 * time.Millisecond):
	}
	g.gate <- struct{}{}
	waitFor(t, done, "sync did not return after the socket write")
	if events, _ := g.got(); len(events) != 1 || events[0] != "ack" {
		t.Fatalf("socket saw %q", events)
	}
	if err := b.sync(); err != nil { // nothing pending
		t.Fatal(err)
	}

	g2 := newGateConn()
	g2.fail = errors.New("broken pipe")
	b2 := newBatchConn(g2)
	defer b2.Close()
	if _, err := b2.Write([]byte("ack")); err != nil {
		t.Fatal(err)
	}
	close(g2.gate)
	if err := b2.sync(); err == nil {
		t.Fatal("sync after a failed write: nil, want the write error")
	}
}

// deleteDLXUnder publishes one message to each of queues through a broker
// whose dead-letter exchange is its own, then deletes that exchange behind
// the broker's back.
func deleteDLXUnder(t *testing.T, url string, queues ...string) *Broker {
	t.Helper()
	dlx := queues[0] + "_dlx"
	b := newBroker(t, url, Options{Logger: quiet, DeadLetterExchange: dlx, MoveDelaysUpTo: -1})
	t.Cleanup(func() { _ = ownChannel(t, url, false).ExchangeDelete(dlx, false, false) })
	for _, q := range queues {
		if err := b.Publish(t.Context(), q, &sdk.Message{Type: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := ownChannel(t, url, false).ExchangeDelete(dlx, false, false); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDeletedDeadLetterExchangeDeclaredAgain: the dead-letter exchange
// deleted behind the broker's back. The first DeadLetter fails (its
// delivery requeued, an error wrapping ErrNotFound); the next ones declare
// it again and succeed, for this queue and for another whose binding went
// with the exchange. Before, the exchange was never declared again: every
// DeadLetter failed until the connection was replaced.
func TestDeletedDeadLetterExchangeDeclaredAgain(t *testing.T) {
	url := serverURL(t)
	q, q2 := testQueue(t, url), testQueue(t, url)
	b := deleteDLXUnder(t, url, q, q, q, q2)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ds, err := b.Receive(ctx, q, 1)
	if err != nil {
		t.Fatal(err)
	}
	err = ds[0].DeadLetter(ctx, errors.New("poison"))
	t.Logf("DeadLetter with the exchange gone: %v", err)
	if !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("DeadLetter with the exchange gone: %v; want an error wrapping sdk.ErrNotFound", err)
	}
	for i := 1; i <= 3; i++ {
		ds, err := b.Receive(ctx, q, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := ds[0].DeadLetter(ctx, errors.New("poison")); err != nil {
			t.Fatalf("DeadLetter #%d after the failed one: %v; want the exchange declared again", i, err)
		}
	}
	ds, err = b.Receive(ctx, q2, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := ds[0].DeadLetter(ctx, errors.New("poison")); err != nil {
		t.Fatalf("DeadLetter of another queue after the exchange was declared again: %v", err)
	}
	for name, want := range map[string]int64{DeadLetterQueue(q): 3, DeadLetterQueue(q2): 1} {
		info, err := b.Info(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if info.Ready != want {
			t.Errorf("%s holds %d dead letters, want %d", name, info.Ready, want)
		}
	}
}

// TestDeadLetter404SparesOtherPublishes: the server answers a dead letter
// published to a missing dead-letter exchange by closing the channel
// (404). Publishes in flight to an existing queue must not fail with it:
// they shared that channel, and were told ErrNotFound, as if their queue
// did not exist.
func TestDeadLetter404SparesOtherPublishes(t *testing.T) {
	url := serverURL(t)
	q, other := testQueue(t, url), testQueue(t, url)
	b := deleteDLXUnder(t, url, q, other)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ds, err := b.Receive(ctx, q, 1)
	if err != nil {
		t.Fatal(err)
	}
	var rs []*sdk.PublishResult
	for range 50 {
		r, err := b.PublishAsync(ctx, other, &sdk.Message{Type: "t"})
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	if err := ds[0].DeadLetter(ctx, errors.New("poison")); !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("DeadLetter with the exchange gone: %v; want an error wrapping sdk.ErrNotFound", err)
	}
	for i, r := range rs {
		if err := r.Wait(ctx); err != nil {
			t.Fatalf("publish %d to existing queue %s, in flight during the dead letter's 404: %v", i, other, err)
		}
	}
}
