package integration

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Child is a process started by [StartChild] or [StartChildStdout]: one
// that a test kills at a chosen point (a worker binary, or the test binary
// re-executed) and that must never outlive that test.
//
// The Child owns cmd.Wait: the test must not call Cmd.Wait itself (a
// second Wait fails with "Wait was already called"), but uses [Child.Wait],
// [Child.Done] or [Child.Kill], which any number of callers may use.
type Child struct {
	Cmd *exec.Cmd

	done chan struct{} // closed when Cmd.Wait has returned
	err  error         // Cmd.Wait's result, set before done is closed
}

// StartChild starts cmd as a child process that dies with the test: it is
// SIGKILLed when the test binary dies (Pdeathsig, which reaches it even
// when no cleanup runs, as after a -timeout panic), and by a t.Cleanup that
// also waits for it, so a t.Fatal before the test's own kill leaves nothing
// running. Other SysProcAttr fields cmd already has are kept.
//
// A failure to start fails the test. cmd must not have been given a
// StdoutPipe or StderrPipe: Wait, which starts at once, would close them
// while the test reads; use [StartChildStdout] for the child's output.
func StartChild(t testing.TB, cmd *exec.Cmd) *Child {
	t.Helper()
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", cmd.Path, err)
	}
	c := &Child{Cmd: cmd, done: make(chan struct{})}
	go func() { // owned by c: ends when the child exits, which the cleanup forces and waits for
		c.err = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() { _ = c.Kill() })
	return c
}

// StartChildStdout is [StartChild] with the child's standard output on a
// pipe, returned for the test to read (cmd.Stdout must be nil). Unlike
// cmd.StdoutPipe, the pipe is not closed when the child is waited for: it
// reads to EOF everything the child wrote, whenever the child exits, and
// the test's cleanup closes it. Read it as long as the child runs: a
// child that fills the pipe blocks.
func StartChildStdout(t testing.TB, cmd *exec.Cmd) (*Child, io.Reader) {
	t.Helper()
	return startChildStdout(t, cmd)
}

// StartChildLines is [StartChildStdout] with the child's standard output
// read line by line on a goroutine of its own: each line, without its
// newline, is sent on the returned channel, which is closed when the
// output ends: at EOF, once the child has exited or been killed. The test
// reads the lines it needs, and may stop at any point; a child that goes on
// writing then blocks once the pipe is full (64 KiB on Linux), so a test
// stops reading only a child it is about to kill or that has little left
// to say.
//
// A line longer than [bufio.MaxScanTokenSize], or a read error, fails the
// test (t.Errorf) and ends the lines: the channel is closed, and what the
// child writes after it is read and discarded, so that the child never
// blocks on a full pipe.
//
// The goroutine is owned by the test: its cleanup kills the child, closes
// the pipe and waits for the goroutine to end, so none outlives the test,
// even one whose lines were never all read.
func StartChildLines(t testing.TB, cmd *exec.Cmd) (*Child, <-chan string) {
	t.Helper()
	c, out := startChildStdout(t, cmd)
	lines := make(chan string)
	stop := make(chan struct{}) // closed by the cleanup: nobody reads any more
	done := make(chan struct{}) // closed when the goroutine has ended
	go func() {                 // owned by the cleanup below, which ends it and waits for it
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-stop:
				close(lines)
				return
			}
		}
		if err := sc.Err(); err != nil {
			select {
			case <-stop: // the cleanup closed the pipe: no fault of the child's
			default:
				t.Errorf("%s: reading its standard output: %v", cmd.Path, err)
			}
		}
		close(lines)
		_, _ = io.Copy(io.Discard, out) // after a scan error: up to EOF
	}()
	t.Cleanup(func() {
		close(stop)
		_ = c.Kill()
		// A process the child started could still hold the pipe open:
		// closing the read end ends the goroutine's read all the same.
		out.Close()
		<-done
	})
	return c, lines
}

// NextFields returns the fields of the next line on lines (from
// [StartChildLines]) that has any, or nil once lines is closed: the child
// exited. A line whose first field is ERROR fails the test with it, as
// does timeout passing with no such line: the marker protocol of the
// brokers' fault-test children.
func NextFields(t testing.TB, lines <-chan string, timeout time.Duration) []string {
	t.Helper()
	expired := time.After(timeout)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return nil
			}
			f := strings.Fields(l)
			if len(f) == 0 {
				continue
			}
			if f[0] == "ERROR" {
				t.Fatalf("child: %s", strings.Join(f, " "))
			}
			return f
		case <-expired:
			t.Fatalf("child said nothing for %s", timeout)
			return nil
		}
	}
}

// startChildStdout is [StartChildStdout], returning the pipe's read end
// as the *os.File it is.
func startChildStdout(t testing.TB, cmd *exec.Cmd) (*Child, *os.File) {
	t.Helper()
	if cmd.Stdout != nil {
		t.Fatal("StartChildStdout: cmd.Stdout already set")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	// Registered before StartChild's cleanup so that it runs after it:
	// the read end is closed once the child is dead and reaped.
	t.Cleanup(func() { r.Close() })
	cmd.Stdout = w
	defer w.Close() // the child has its copy: EOF comes when it exits
	return StartChild(t, cmd), r
}

// dieWithParent has the kernel SIGKILL the process cmd starts when its
// parent dies, so that it does not outlive a test binary that crashed or
// was killed, merging that into the SysProcAttr cmd already has.
func dieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}

// Done returns a channel closed when the child has exited and been
// reaped; [Child.Wait] then returns at once.
func (c *Child) Done() <-chan struct{} { return c.done }

// Wait waits for the child to exit and returns what cmd.Wait returned: an
// *exec.ExitError for a non-zero exit or a death by signal.
func (c *Child) Wait() error {
	<-c.done
	return c.err
}

// Kill sends the child SIGKILL, unless it has already exited, and returns
// [Child.Wait].
func (c *Child) Kill() error {
	// Harmless once it has exited: os.Process signals no process it has
	// reaped (whose PID may be another process's by then).
	_ = c.Cmd.Process.Kill()
	return c.Wait()
}
