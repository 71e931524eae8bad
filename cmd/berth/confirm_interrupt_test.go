package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// cancelAtPrompt is a stderr that cancels the run once the confirmation
// prompt is written: the operator's Ctrl-C at the question.
type cancelAtPrompt struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	cancel context.CancelFunc
}

func (w *cancelAtPrompt) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.buf.Write(p)
	if strings.Contains(w.buf.String(), "[y/N] ") {
		w.cancel()
	}
	return n, err
}

func (w *cancelAtPrompt) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// readReturned is a stdin that reports when a Read of it has returned.
type readReturned struct {
	r    io.Reader
	once sync.Once
	done chan struct{}
}

func (r *readReturned) Read(p []byte) (int, error) {
	defer r.once.Do(func() { close(r.done) })
	return r.r.Read(p)
}

// TestConfirmInterrupted: an interrupt (SIGINT, the run's context
// cancelled) at a change's y/N question ends the command at once, exit 4
// (interrupted), nothing changed. Before, the read of the answer blocked
// until a line or EOF came: the first Ctrl-C did nothing and a second one
// killed the process. The read of stdin, which nothing can stop, is left
// to end with stdin (here: when the pipe is closed).
func TestConfirmInterrupted(t *testing.T) {
	for _, args := range [][]string{
		{"dlq", "purge", "billing", "-class", "permanent"},
		{"dlq", "redrive", "billing", "-json"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			b, _ := deadLettered(t, 4)
			pr, pw, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer pr.Close()
			closeAnswer := sync.OnceFunc(func() { pw.Close() })
			defer closeAnswer()
			stdin := &readReturned{r: pr, done: make(chan struct{})}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			stderr := &cancelAtPrompt{cancel: cancel}
			var out bytes.Buffer
			e := env{interactive: true, stdin: stdin, stdout: &out, stderr: stderr,
				getenv: func(string) string { return "" },
				open:   func(context.Context, string) (sdk.Broker, error) { return nopClose{b}, nil }}
			code := make(chan int, 1)
			go func() { code <- run(ctx, append([]string{"-url", "mem://"}, args...), e) }()
			var got int
			select {
			case got = <-code:
			case <-time.After(10 * time.Second):
				closeAnswer() // EOF: the blocked read returns, and the run with it
				got = <-code
				t.Errorf("interrupted at the question, the command still waited for an answer 10s later")
			}
			if got != exitPartial || !strings.Contains(stderr.String(), "interrupted") || !strings.Contains(stderr.String(), "nothing changed") {
				t.Errorf("exit %d, want %d (interrupted, nothing changed); stderr:\n%s", got, exitPartial, stderr.String())
			}
			if out.Len() != 0 {
				t.Errorf("stdout %q, want nothing", out.String())
			}
			if st := stats(t, b); st.DeadLettered != 4 || st.Ready != 1 {
				t.Errorf("after the interrupt: %+v, want the 4 dead letters and 1 ready untouched", st)
			}
			// The read of the answer ends with stdin (for the berth
			// command, when the process exits): no goroutine is left.
			closeAnswer()
			select {
			case <-stdin.done:
			case <-time.After(10 * time.Second):
				t.Fatal("the read of the answer did not return when stdin was closed")
			}
		})
	}
}
