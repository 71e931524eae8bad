package brokerurl_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/brokerurl"
	"github.com/berthq/berth/sdk"
)

// silentServer listens on 127.0.0.1 and accepts every connection without
// ever writing to it: a host that takes the TCP connection and never
// answers (a hung broker, a black hole behind a proxy). It returns the
// address and a channel that receives once per connection accepted. The
// listener and its connections are closed when the test ends.
func silentServer(t *testing.T) (string, <-chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan struct{}, 64)
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			select {
			case accepted <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return l.Addr().String(), accepted
}

// openAsync runs Open in a goroutine and returns the channel of its outcome
// (a broker it returns is closed).
func openAsync(ctx context.Context, raw string, opts brokerurl.Options) <-chan error {
	done := make(chan error, 1)
	go func() {
		b, err := brokerurl.Open(ctx, raw, opts)
		if b != nil {
			_ = b.Close()
		}
		done <- err
	}()
	return done
}

// hung is how long a test waits for an Open that should have ended before
// it calls it hung: far beyond the timeouts the tests give, and below the
// default one (so that an Open ended by it does not pass for cancelled).
const hung = 15 * time.Second

func silentURLs(addr string) []string {
	return []string{
		"amqp://guest:guest@" + addr + "/",
		"postgres://berth@" + addr + "/db",
	}
}

// TestOpenBoundsASilentServer: Open with a ctx without a deadline waited
// for ever on a RabbitMQ or PostgreSQL host that accepts the TCP connection
// and never answers (amqp091 retried its 30 s handshake until ctx ended;
// pgx waited for the server's first message with no timeout at all).
// Connecting is now bounded by Options.ConnectTimeout (default
// DefaultConnectTimeout) when ctx has no deadline, and the error says so
// and wraps context.DeadlineExceeded.
func TestOpenBoundsASilentServer(t *testing.T) {
	addr, accepted := silentServer(t)
	for _, raw := range silentURLs(addr) {
		done := openAsync(context.Background(), raw, brokerurl.Options{ConnectTimeout: 300 * time.Millisecond})
		var err error
		select {
		case err = <-done:
		case <-time.After(hung):
			t.Fatalf("Open(%s) on a silent server with a ctx without deadline: still waiting after %s", raw, hung)
		}
		select {
		case <-accepted:
		default:
			t.Fatalf("Open(%s): the silent server accepted no connection (the test tests nothing): %v", raw, err)
		}
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "connect timeout") {
			t.Errorf("Open(%s) on a silent server: %v, want an error naming the connect timeout and wrapping context.DeadlineExceeded", raw, err)
		}
		if raw[:4] == "amqp" && !errors.Is(err, sdk.ErrUnavailable) {
			t.Errorf("Open(%s) on a silent server: %v, want it to wrap sdk.ErrUnavailable still", raw, err)
		}
	}
	if brokerurl.DefaultConnectTimeout <= hung {
		t.Errorf("DefaultConnectTimeout %s: the cancellation test below cannot tell it from a cancellation", brokerurl.DefaultConnectTimeout)
	}
}

// TestOpenOnASilentServerEndsWhenCancelled: with the default connect
// timeout in force, cancelling ctx still ends Open at once.
func TestOpenOnASilentServerEndsWhenCancelled(t *testing.T) {
	addr, accepted := silentServer(t)
	for _, raw := range silentURLs(addr) {
		ctx, cancel := context.WithCancel(context.Background())
		done := openAsync(ctx, raw, brokerurl.Options{})
		select {
		case <-accepted: // Open is connecting
		case err := <-done:
			cancel()
			t.Fatalf("Open(%s) ended before connecting: %v", raw, err)
		case <-time.After(hung):
			cancel()
			t.Fatalf("Open(%s) never connected to the silent server", raw)
		}
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Open(%s) cancelled: %v, want context.Canceled", raw, err)
			}
		case <-time.After(hung):
			t.Fatalf("Open(%s) still waiting %s after its ctx was cancelled", raw, hung)
		}
	}
}
