package integration

import (
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
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
