package jetstream_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// TestConnectDeadlineBoundsOnlyFirstConnect: Connect made its ctx's time
// left the connection's Timeout, which bounds every reconnect's dial and
// handshake for the connection's life.
//
//   - short: a Connect given 1 s could never reconnect once a reconnect's
//     handshake took longer than that (here 1.2 s through a slow link);
//   - long: a Connect given 2 min held nats.go's connection lock through a
//     reconnect to a silent server for 2 min (every call on the
//     connection waits for that lock);
//   - cancelled: the first connect ignored ctx's cancellation, ending only
//     at the connection's Timeout.
func TestConnectDeadlineBoundsOnlyFirstConnect(t *testing.T) {
	opts := jetstream.Options{WaitTime: 500 * time.Millisecond, Logger: quiet}
	connect := func(t *testing.T, ctx context.Context, url string) *jetstream.Broker {
		t.Helper()
		b, err := jetstream.Connect(ctx, url, jetstream.ConnectOptions{Name: "berth-test-connect-deadline", ReconnectWait: 50 * time.Millisecond}, opts)
		if err != nil {
			t.Fatalf("Connect: %v", err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b
	}

	t.Run("short", func(t *testing.T) {
		u, p := integration.ProxyURL(t, integration.NATSURL(t))
		cctx, ccancel := context.WithTimeout(t.Context(), time.Second)
		b := connect(t, cctx, u.String())
		ccancel()
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		p.SetLatency(400 * time.Millisecond) // a handshake: INFO, CONNECT+PING, PONG: 1.2 s
		p.Reset()
		waitConn(ctx, t, b, false)
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		defer wcancel()
		for b.ConnectionError() != nil {
			select {
			case <-wctx.Done():
				t.Fatalf("not reconnected 10 s after the reset, through a link whose handshake takes 1.2 s: %v (the reconnect's handshake bounded by the 1 s Connect gave, not the connection's Timeout)", b.ConnectionError())
			case <-time.After(10 * time.Millisecond):
			}
		}
	})

	t.Run("long", func(t *testing.T) {
		u, p := integration.ProxyURL(t, integration.NATSURL(t))
		cctx, ccancel := context.WithTimeout(t.Context(), 2*time.Minute)
		b := connect(t, cctx, u.String())
		ccancel()
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		p.Freeze() // new connections: accepted, never answered
		p.Reset()
		waitConn(ctx, t, b, false)
		time.Sleep(300 * time.Millisecond) // the reconnect's handshake is under way, holding the lock
		got := make(chan struct{})
		go func() {
			_ = b.Conn().Status() // takes the connection's lock
			close(got)
		}()
		select {
		case <-got:
		case <-time.After(6 * time.Second):
			t.Errorf("the connection's lock still held 6 s into a reconnect to a silent server (its handshake bounded by the 2 min Connect gave, not the connection's Timeout)")
		}
		p.Thaw()
		<-got
	})

	t.Run("cancelled", func(t *testing.T) {
		addr := integration.SilentServer(t)
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(200*time.Millisecond, cancel)
		start := time.Now()
		// A connection Timeout of 30 s, which a Connect that ignored its
		// cancelled ctx would wait out: 10 s tells the two apart with room
		// for a loaded machine.
		b, err := jetstream.Connect(ctx, "nats://"+addr, jetstream.ConnectOptions{Name: "berth-test-connect-cancel",
			Extra: []nats.Option{nats.Timeout(30 * time.Second)}}, opts)
		took := time.Since(start)
		if err == nil {
			_ = b.Close()
			t.Fatal("Connect to a silent server succeeded")
		}
		if !errors.Is(err, context.Canceled) || !errors.Is(err, sdk.ErrUnavailable) || took > 10*time.Second {
			t.Errorf("Connect cancelled after 200 ms = %v after %v; want context.Canceled (and ErrUnavailable), not the 30 s Timeout", err, took)
		}
	})
}
