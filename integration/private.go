package integration

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Private service instances: a RabbitMQ node, a PostgreSQL cluster, a
// Redis server and a nats-server with JetStream that one test owns, on free
// loopback ports, with their data in a temporary directory. A test may stop,
// kill, restart or flush them without disturbing the shared services other
// packages' tests use at the same time.
// Each starts in seconds, is stopped when the test ends (t.Cleanup kills its
// whole process group) and is skipped with the reason when its binaries are
// missing — except under CI=true, where that fails the test.

// missing skips (or, under CI=true, fails) a test whose private service
// cannot be started.
func missing(t testing.TB, what string, err error) {
	t.Helper()
	if InCI() {
		t.Fatalf("integration: private %s: %v (CI=true: integration tests must not skip)", what, err)
	}
	t.Skipf("integration: private %s: %v", what, err)
}

// freePort returns a loopback TCP port nobody listens on now, below the
// kernel's ephemeral range. The server binds it seconds later; a port from
// the ephemeral range (what listening on port 0 gives) could meanwhile
// become the local end of any outgoing connection on the machine, and the
// CI runs thousands of them, so the server would fail to start.
//
// It never returns a port twice in this process: picked at random, two
// servers started in parallel (or one's port and the other's cluster bus
// port) could get the same one, and the second to bind it failed. A
// server of another test process can still take a port before it is
// bound: a private Redis's first start looks out for that and moves to
// other ports (startNew).
func freePort() (int, error) {
	low := ephemeralLow()
	var lastErr error
	for range 100 {
		port := 10000 + rand.IntN(low-10000)
		handedOut.Lock()
		taken := handedOut.ports[port]
		handedOut.ports[port] = true // a busy one is not tried again either
		handedOut.Unlock()
		if taken {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			lastErr = err
			continue
		}
		_ = ln.Close()
		return port, nil
	}
	return 0, fmt.Errorf("no free port below %d: %w", low, lastErr)
}

// handedOut holds the ports freePort tried in this process, never tried
// again: a stopped server may start again on its port.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: make(map[int]bool)}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux's
// ip_local_port_range), 32768 where it cannot be read.
func ephemeralLow() int {
	const dflt = 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return dflt
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return dflt
	}
	low, err := strconv.Atoi(f[0])
	if err != nil || low <= 11000 {
		return dflt
	}
	return low
}

// findBinary returns the first of the candidate paths that is executable,
// else name looked up in PATH.
func findBinary(name string, candidates ...string) (string, error) {
	for _, c := range candidates {
		matches, _ := filepath.Glob(c)
		for i := len(matches) - 1; i >= 0; i-- { // newest version last in glob order
			if st, err := os.Stat(matches[i]); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
				return matches[i], nil
			}
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s not found (looked in %s and PATH)", name, strings.Join(candidates, ", "))
	}
	return p, nil
}

// proc is one server process started in its own process group, so that a
// stop reaches every process it spawned (the RabbitMQ start script runs the
// Erlang VM as its child).
type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd.Wait returned
	log  *os.File
}

// startProc starts cmd in a new process group, its output appended to logPath.
func startProc(cmd *exec.Cmd, logPath string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = f, f
	dieWithParent(cmd) // the test binary died: do not outlive it
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	p := &proc{cmd: cmd, done: make(chan struct{}), log: f}
	go func() { // owned by p: ends when the process group leader exits
		_ = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// signal sends sig to the whole process group.
func (p *proc) signal(sig syscall.Signal) {
	_ = syscall.Kill(-p.cmd.Process.Pid, sig)
}

// exited reports whether the group leader has exited.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends sig to the group and waits up to grace for the leader to exit
// and the group to be empty; then it SIGKILLs the group.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) {
	p.signal(sig)
	deadline := time.After(grace)
	select {
	case <-p.done:
	case <-deadline:
		p.signal(syscall.SIGKILL)
		<-p.done
	}
	// The leader is gone; its children (the Erlang VM) may still be
	// stopping. Wait for the group to empty, then make sure.
	for end := time.Now().Add(grace); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if syscall.Kill(-p.cmd.Process.Pid, 0) != nil {
			return
		}
	}
	p.signal(syscall.SIGKILL)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if syscall.Kill(-p.cmd.Process.Pid, 0) != nil {
			return
		}
	}
}

// waitTCP waits until addr accepts a connection, the process exits, or
// timeout passes.
func waitTCP(p *proc, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
		if err == nil {
			return c.Close()
		}
		if p.exited() {
			return errors.New("the server exited before it listened")
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer within %v: %w", addr, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tailFile returns the last n bytes of a log file, for failure messages.
func tailFile(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(st.Size()-n, 0)
	buf := make([]byte, st.Size()-off)
	_, _ = f.ReadAt(buf, off)
	return string(buf)
}

// readFrom returns a log file's content from offset off, for telling what
// one start of a server wrote.
func readFrom(path string, off int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	b, _ := io.ReadAll(io.NewSectionReader(f, off, 1<<30))
	return string(b)
}

// server is the state every private instance shares: its current process,
// guarded because a test may stop it from another goroutine.
type server struct {
	mu   sync.Mutex
	proc *proc
}

func (s *server) current() *proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc
}

func (s *server) set(p *proc) {
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
}
