package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// The fault tests run this test binary again as a worker process that they
// can SIGKILL. helperEnv selects the role; the child reads the server URL and
// the queue from helperURL and helperQueue and reports on stdout, one marker
// line at a time.
const (
	helperEnv   = "BERTH_RMQ_HELPER"
	helperURL   = "BERTH_RMQ_HELPER_URL"
	helperQueue = "BERTH_RMQ_HELPER_QUEUE"
	helperHold  = "BERTH_RMQ_HELPER_HOLD"
)

// helperProcess is the child process of the fault tests, run by TestMain
// instead of the tests when helperEnv names its role. It ends by exiting or
// by being SIGKILLed.
func helperProcess(role string) {
	ctx := context.Background()
	b, err := New(ctx, os.Getenv(helperURL), Options{Prefetch: 1, Logger: quiet, MaxDeliveries: 3})
	if role == "hold" {
		// Prefetch = the batch: every message the server hands this
		// process is in the batch (prefetched ones would count too).
		n, _ := strconv.Atoi(os.Getenv(helperHold))
		if b != nil {
			_ = b.Close()
		}
		b, err = New(ctx, os.Getenv(helperURL), Options{Prefetch: n, Logger: quiet})
	}
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	q := os.Getenv(helperQueue)
	switch role {
	case "hold":
		// Receive a batch, ack its first half, hold the rest unacked and
		// wait to be killed.
		n, _ := strconv.Atoi(os.Getenv(helperHold))
		var held []sdk.Delivery
		for len(held) < n {
			ds, err := b.Receive(ctx, q, n-len(held))
			if err != nil {
				fmt.Println("ERROR", err)
				os.Exit(1)
			}
			held = append(held, ds...)
		}
		for _, d := range held[:n/2] {
			if err := d.Ack(ctx); err != nil {
				fmt.Println("ERROR", err)
				os.Exit(1)
			}
			fmt.Println("ACKED", d.Message().ID)
		}
		for _, d := range held[n/2:] {
			fmt.Println("HELD", d.Message().ID, d.Attempt())
		}
		fmt.Println("READY")
		select {}
	case "worker":
		// A Worker whose handler crashes the process on a poison message.
		h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
			if d.Message().Type == "poison" {
				fmt.Println("CRASH", d.Message().ID, d.Attempt())
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {}
			}
			fmt.Println("DONE", d.Message().ID, d.Attempt())
			return nil
		})
		w, err := sdk.NewWorker(b, h, sdk.WorkerOptions{Queue: q, Concurrency: 1, Prefetch: 1, Logger: quiet})
		if err != nil {
			fmt.Println("ERROR", err)
			os.Exit(1)
		}
		fmt.Println("READY")
		_ = w.Run(ctx)
	}
	os.Exit(0)
}

// child is a running helper process; it dies with its test (and with
// this process).
type child struct {
	*integration.Child
	lines <-chan string // its output lines; closed at exit
}

// startChild runs this test binary as a helper in role, on queue.
func startChild(t *testing.T, role, url, queue string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+role, helperURL+"="+url, helperQueue+"="+queue)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	c, lines := integration.StartChildLines(t, cmd)
	return &child{Child: c, lines: lines}
}

// next returns the child's next marker line split into fields, or nil
// when it exited (see integration.NextFields).
func (c *child) next(t *testing.T, timeout time.Duration) []string {
	t.Helper()
	return integration.NextFields(t, c.lines, timeout)
}

func (c *child) kill(t *testing.T) {
	t.Helper()
	if err := c.Cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("SIGKILL: %v", err)
	}
}

// brokerOnQueue returns the server's URL, a fresh queue name and a Broker
// with opts, closed when the test ends: the set-up most tests here share.
func brokerOnQueue(t *testing.T, opts Options) (url, queue string, b *Broker) {
	t.Helper()
	url = serverURL(t)
	return url, testQueue(t, url), newBroker(t, url, opts)
}

// ownChannel opens a channel on a connection of its own to url, behind the
// broker's back (in confirm mode when confirm), closed when the test ends.
func ownChannel(t testing.TB, url string, confirm bool) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if confirm {
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
	}
	return ch
}
