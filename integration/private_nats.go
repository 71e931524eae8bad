package integration

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// NATSServer is a private nats-server with JetStream a test owns, on a free
// loopback port, its file store in a temporary directory: a test may stop,
// kill and start it again on the same store without touching the shared
// NATS.
type NATSServer struct {
	// URL is nats://127.0.0.1:<port>.
	URL string
	// Port is the TCP port on 127.0.0.1.
	Port int

	bin, dir string
	server
}

// StartNATS starts a private nats-server with JetStream (well under a
// second) and waits until it accepts connections. It is stopped when the
// test ends. Without nats-server the test is skipped (failed under CI=true).
func StartNATS(t testing.TB) *NATSServer {
	t.Helper()
	bin, err := findBinary("nats-server", "/usr/sbin/nats-server", "/usr/bin/nats-server", "/usr/local/bin/nats-server")
	if err != nil {
		missing(t, "NATS", err)
		return nil
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	s := &NATSServer{URL: fmt.Sprintf("nats://127.0.0.1:%d", port), Port: port, bin: bin, dir: t.TempDir()}
	t.Cleanup(func() {
		if p := s.current(); p != nil {
			p.stop(syscall.SIGKILL, 5*time.Second)
		}
	})
	s.Start(t)
	return s
}

// Start starts the server (again, after Stop or Kill) on its store
// directory and waits until it accepts connections.
func (s *NATSServer) Start(t testing.TB) {
	t.Helper()
	if p := s.current(); p != nil && !p.exited() {
		t.Fatal("nats: already running")
	}
	cmd := exec.Command(s.bin, "-a", "127.0.0.1", "-p", fmt.Sprint(s.Port), "-js", "-sd", s.dir+"/store")
	cmd.Env = os.Environ()
	logPath := s.dir + "/nats.log"
	p, err := startProc(cmd, logPath)
	if err != nil {
		t.Fatalf("start nats-server: %v", err)
	}
	s.set(p)
	if err := waitTCP(p, fmt.Sprintf("127.0.0.1:%d", s.Port), 30*time.Second); err != nil {
		p.stop(syscall.SIGKILL, 5*time.Second)
		t.Fatalf("nats: %v\n%s", err, tailFile(logPath, 2000))
	}
}

// Stop stops the server cleanly (SIGTERM: it closes its clients and writes
// its streams' state) and waits until it is gone.
func (s *NATSServer) Stop(t testing.TB) {
	t.Helper()
	if p := s.current(); p != nil {
		p.stop(syscall.SIGTERM, 30*time.Second)
	}
}

// Kill SIGKILLs the server: the next Start recovers the file store from
// what reached the disk.
func (s *NATSServer) Kill(t testing.TB) {
	t.Helper()
	if p := s.current(); p != nil {
		p.stop(syscall.SIGKILL, 5*time.Second)
	}
}

// Log returns the end of the server's log, for failure messages.
func (s *NATSServer) Log() string { return tailFile(s.dir+"/nats.log", 4000) }
