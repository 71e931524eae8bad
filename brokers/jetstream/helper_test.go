package jetstream_test

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

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// Environment of the fault tests' child process.
const (
	helperEnv   = "BERTH_JS_HELPER" // the child's role: "hold", "ackkill" or "worker"
	helperURL   = "BERTH_JS_HELPER_URL"
	helperQueue = "BERTH_JS_HELPER_QUEUE"
	helperHold  = "BERTH_JS_HELPER_HOLD"
)

// childAckWait and childMaxDeliveries configure the child's broker.
const (
	childAckWait       = time.Second
	childMaxDeliveries = 3
)

// helperProcess is the child process of the fault tests, run by TestMain
// instead of the tests when helperEnv names its role. It ends by exiting or
// by being SIGKILLed.
func helperProcess(role string) {
	ctx := context.Background()
	b, err := jetstream.Connect(ctx, os.Getenv(helperURL), jetstream.ConnectOptions{Name: "berth-test-child"},
		jetstream.Options{AckWait: childAckWait, WaitTime: 700 * time.Millisecond, MaxDeliveries: childMaxDeliveries, Logger: quiet})
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
	case "ackkill":
		// Receive one message, ack it, and SIGKILL this process the
		// moment Ack returns.
		for {
			ds, err := b.Receive(ctx, q, 1)
			if err != nil {
				fmt.Println("ERROR", err)
				os.Exit(1)
			}
			if len(ds) == 0 {
				continue
			}
			if err := ds[0].Ack(ctx); err != nil {
				fmt.Println("ERROR", err)
				os.Exit(1)
			}
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
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
		w, err := sdk.NewWorker(b, h, sdk.WorkerOptions{Queue: q, Concurrency: 1, Prefetch: 1, Lease: childAckWait, Logger: quiet})
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
