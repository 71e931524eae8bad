package integration

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// RedisServer is a private redis-server a test owns, on a free loopback
// port, without persistence: a test may FLUSHALL, stop or kill it without
// touching the shared Redis.
type RedisServer struct {
	// Addr is host:port.
	Addr string

	bin, dir string
	port     int
	server
}

// StartRedis starts a private redis-server (well under a second) and waits
// until it accepts connections. It is stopped when the test ends. Without
// redis-server the test is skipped (failed under CI=true).
func StartRedis(t testing.TB) *RedisServer {
	t.Helper()
	bin, err := findBinary("redis-server", "/usr/bin/redis-server", "/usr/local/bin/redis-server")
	if err != nil {
		missing(t, "Redis", err)
		return nil
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	s := &RedisServer{Addr: fmt.Sprintf("127.0.0.1:%d", port), bin: bin, dir: t.TempDir(), port: port}
	t.Cleanup(func() {
		if p := s.current(); p != nil {
			p.stop(syscall.SIGKILL, 5*time.Second)
		}
	})
	s.Start(t)
	return s
}

// Start starts the server (again, after Stop) empty and waits until it
// accepts connections.
func (s *RedisServer) Start(t testing.TB) {
	t.Helper()
	if p := s.current(); p != nil && !p.exited() {
		t.Fatal("redis: already running")
	}
	cmd := exec.Command(s.bin, "--port", fmt.Sprint(s.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--daemonize", "no", "--protected-mode", "yes")
	cmd.Env = os.Environ()
	logPath := s.dir + "/redis.log"
	p, err := startProc(cmd, logPath)
	if err != nil {
		t.Fatalf("start redis: %v", err)
	}
	s.set(p)
	if err := waitTCP(p, s.Addr, 30*time.Second); err != nil {
		p.stop(syscall.SIGKILL, 5*time.Second)
		t.Fatalf("redis: %v\n%s", err, tailFile(logPath, 2000))
	}
}

// Stop stops the server (SIGTERM; nothing is saved) and waits until it is gone.
func (s *RedisServer) Stop(t testing.TB) {
	t.Helper()
	if p := s.current(); p != nil {
		p.stop(syscall.SIGTERM, 10*time.Second)
	}
}
