package integration

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
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

// exitsCleanly fails the test, with the message stuck, unless c exits
// within 30 seconds (a guard, not a measure), and unless it exits 0.
func exitsCleanly(t *testing.T, c *Child, stuck string) {
	t.Helper()
	select {
	case <-c.Done():
	case <-time.After(30 * time.Second):
		t.Fatal(stuck)
	}
	if err := c.Wait(); err != nil {
		t.Fatalf("Wait: %v", err)
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
	exitsCleanly(t, c, "sh did not exit")
	b, err := io.ReadAll(out)
	if err != nil || string(b) != "one\ntwo\n" {
		t.Fatalf("read %q, %v; want \"one\\ntwo\\n\"", b, err)
	}
}

// TestStartChildLinesInOrder: every line the child wrote arrives, in
// order and without its newline, the last one too when it has none, and
// the channel is closed at EOF, once the child has exited.
func TestStartChildLinesInOrder(t *testing.T) {
	c, lines := StartChildLines(t, exec.Command("sh", "-c", "seq 1 2000; printf last"))
	var got []string
	timeout := time.After(30 * time.Second) // a guard, not a measure
	for done := false; !done; {
		select {
		case l, ok := <-lines:
			if !ok {
				done = true
				break
			}
			got = append(got, l)
		case <-timeout:
			t.Fatalf("the lines were not closed; %d read", len(got))
		}
	}
	var want []string
	for i := range 2000 {
		want = append(want, fmt.Sprint(i+1))
	}
	if want = append(want, "last"); !slices.Equal(got, want) {
		t.Errorf("read %d lines, want %d: 1 to 2000 and \"last\", in order", len(got), len(want))
	}
	if err := c.Wait(); err != nil {
		t.Errorf("Wait: %v", err)
	}
}

// errorRecorder is a testing.TB whose Errorf records, rather than fails.
type errorRecorder struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *errorRecorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestStartChildLinesLongLine: a line longer than the scanner takes fails
// the test, with the scanner's error, and ends the lines; what follows it
// is read and dropped, so the child, which writes more than a pipe holds,
// does not block but exits.
func TestStartChildLinesLongLine(t *testing.T) {
	rec := &errorRecorder{TB: t}
	long := bufio.MaxScanTokenSize + 1
	script := fmt.Sprintf("echo first; head -c %d /dev/zero | tr '\\0' x; echo; head -c 200000 /dev/zero; echo after", long)
	c, lines := StartChildLines(rec, exec.Command("sh", "-c", script))
	var got []string
	for l := range lines {
		got = append(got, l)
	}
	if !slices.Equal(got, []string{"first"}) {
		t.Errorf("read %q before the end, want only \"first\"", got)
	}
	exitsCleanly(t, c, "the child did not exit: is the rest of its output read?")
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], bufio.ErrTooLong.Error()) {
		t.Errorf("errors %q, want one with %q", rec.errs, bufio.ErrTooLong)
	}
}

// TestStartChildLinesNoLeak: a test that reads one line of a child that
// writes more and never exits leaves no goroutine behind: its cleanup
// kills the child and ends the reader, which was blocked on a send.
func TestStartChildLinesNoLeak(t *testing.T) {
	before := goleak.IgnoreCurrent()
	var c *Child
	t.Run("sub", func(t *testing.T) {
		var lines <-chan string
		c, lines = StartChildLines(t, exec.Command("sh", "-c", "echo one; echo two; echo three; exec sleep 60"))
		select {
		case l := <-lines:
			if l != "one" {
				t.Errorf("first line %q, want \"one\"", l)
			}
		case <-time.After(30 * time.Second): // a guard, not a measure
			t.Fatal("no line from the child")
		}
	})
	if err := c.Wait(); !killedBySIGKILL(err) {
		t.Errorf("Wait = %v, want a death by SIGKILL", err)
	}
	goleak.VerifyNone(t, before)
}

// TestStartChildLinesGrandchildHoldsThePipe: a process the child started
// that keeps the pipe's write end open does not hold up the test's
// cleanup, which closes the read end and so ends the reader blocked in
// Read; and that closing is reported as no fault of the child's.
func TestStartChildLinesGrandchildHoldsThePipe(t *testing.T) {
	var grandchild atomic.Int64
	t.Cleanup(func() {
		if pid := grandchild.Load(); pid > 0 {
			_ = syscall.Kill(int(pid), syscall.SIGKILL)
		}
	})
	var rec *errorRecorder
	ran := make(chan struct{})
	go func() { // waited for below, or ended by killing the grandchild
		defer close(ran)
		t.Run("sub", func(st *testing.T) {
			rec = &errorRecorder{TB: st}
			_, lines := StartChildLines(rec, exec.Command("sh", "-c", "sleep 60 & echo $!; echo ready; exec sleep 60"))
			pid, err := strconv.Atoi(<-lines)
			if err != nil {
				st.Fatalf("the grandchild's PID: %v", err)
			}
			grandchild.Store(int64(pid))
			if l := <-lines; l != "ready" {
				st.Fatalf("second line %q, want \"ready\"", l)
			}
		})
	}()
	select {
	case <-ran:
	case <-time.After(30 * time.Second): // a guard, not a measure: the grandchild sleeps 60 s
		if pid := grandchild.Load(); pid > 0 {
			_ = syscall.Kill(int(pid), syscall.SIGKILL)
		}
		<-ran
		t.Fatal("the cleanup waited for the grandchild that holds the pipe")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.errs) > 0 {
		t.Errorf("closing the pipe at the cleanup was reported: %q", rec.errs)
	}
}

// fatalRecorder is a testing.TB whose Fatalf records and ends its
// goroutine, as the real one does, without failing the test.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestNextFields: the fields of the next line with any (blank lines
// skipped), nil once the lines end; an ERROR line, or no line within the
// timeout, fails the test.
func TestNextFields(t *testing.T) {
	lines := make(chan string, 4)
	lines <- ""
	lines <- "  "
	lines <- "READY a b"
	close(lines)
	if got := NextFields(t, lines, 30*time.Second); !slices.Equal(got, []string{"READY", "a", "b"}) {
		t.Errorf("NextFields = %q, want [READY a b]", got)
	}
	if got := NextFields(t, lines, 30*time.Second); got != nil {
		t.Errorf("NextFields after the end = %q, want nil", got)
	}

	fails := func(lines <-chan string, timeout time.Duration) string {
		rec := &fatalRecorder{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			NextFields(rec, lines, timeout)
		}()
		<-done
		return rec.msg
	}
	errLine := make(chan string, 1)
	errLine <- "ERROR the broker refused"
	if msg := fails(errLine, 30*time.Second); msg != "child: ERROR the broker refused" {
		t.Errorf("an ERROR line: Fatalf %q, want the line", msg)
	}
	if msg := fails(make(chan string), time.Millisecond); !strings.Contains(msg, "said nothing") {
		t.Errorf("no line: Fatalf %q, want a timeout", msg)
	}
}
