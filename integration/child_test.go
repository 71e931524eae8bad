package integration

import (
	"errors"
	"io"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// killedBySIGKILL reports whether err is cmd.Wait's for a death by SIGKILL.
func killedBySIGKILL(err error) bool {
	var exit *exec.ExitError
	return errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL
}

// TestStartChildDiesWithItsTest: a child the test never kills is killed
// and reaped by the subtest's cleanup, with Pdeathsig set and the
// SysProcAttr field the caller had set kept.
func TestStartChildDiesWithItsTest(t *testing.T) {
	var c *Child
	t.Run("sub", func(t *testing.T) {
		cmd := exec.Command("sleep", "60")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		c = StartChild(t, cmd)
		if a := cmd.SysProcAttr; a.Pdeathsig != syscall.SIGKILL || !a.Setpgid {
			t.Errorf("SysProcAttr %+v: want Pdeathsig SIGKILL and Setpgid kept", a)
		}
		select {
		case <-c.Done():
			t.Fatalf("the child exited at once: %v", c.Wait())
		default:
		}
	})
	select {
	case <-c.Done(): // the cleanup has waited: closed already
	default:
		t.Fatal("the child still runs after its test's cleanup")
	}
	if err := c.Wait(); !killedBySIGKILL(err) {
		t.Errorf("Wait = %v, want a death by SIGKILL", err)
	}
	// Reaped, not a zombie: the PID is gone.
	if err := syscall.Kill(c.Cmd.Process.Pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("kill(pid, 0) = %v, want ESRCH", err)
	}
}

// TestStartChildKillTwice: Kill, Wait and the cleanup may all come after
// one another and give the same answer.
func TestStartChildKillTwice(t *testing.T) {
	c := StartChild(t, exec.Command("sleep", "60"))
	first := c.Kill()
	if !killedBySIGKILL(first) {
		t.Fatalf("Kill = %v, want a death by SIGKILL", first)
	}
	if err := c.Kill(); err != first {
		t.Errorf("second Kill = %v, want %v", err, first)
	}
	if err := c.Wait(); err != first {
		t.Errorf("Wait after Kill = %v, want %v", err, first)
	}
}

// TestStartChildStdoutOutlivesWait: what the child wrote before it exited
// is still read after Wait, which cmd.StdoutPipe would have closed.
func TestStartChildStdoutOutlivesWait(t *testing.T) {
	c, out := StartChildStdout(t, exec.Command("sh", "-c", "echo one; echo two"))
	select {
	case <-c.Done():
	case <-time.After(30 * time.Second): // a guard, not a measure
		t.Fatal("sh did not exit")
	}
	if err := c.Wait(); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	b, err := io.ReadAll(out)
	if err != nil || string(b) != "one\ntwo\n" {
		t.Fatalf("read %q, %v; want \"one\\ntwo\\n\"", b, err)
	}
}
