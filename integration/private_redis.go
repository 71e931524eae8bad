package integration

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
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
	busPort  int // the cluster bus's; 0: not a cluster node
	server
}

// StartRedisCluster starts a private redis-server in cluster mode, one node
// owning every hash slot, and waits until the cluster is up. Connect with
// redis.NewClusterClient on Addr: the server checks as every cluster does
// that the keys of one command share a hash slot (CROSSSLOT otherwise).
// The node's cluster bus gets a free port of its own. Needs Redis 7.0 or
// later (cluster-port, CLUSTER ADDSLOTSRANGE); skipped without redis-server
// as [StartRedis] is.
func StartRedisCluster(t testing.TB) *RedisServer {
	t.Helper()
	s := newRedisServer(t)
	if s == nil {
		return nil
	}
	// The cluster bus listens on a port of its own, by default the port +
	// 10000: in or above the ephemeral range for many of the ports freePort
	// gives, and nobody checked it was free. Pick it the same way.
	for s.busPort = s.port; s.busPort == s.port; {
		var err error
		if s.busPort, err = freePort(); err != nil {
			t.Fatal(err)
		}
	}
	s.Start(t)
	if err := clusterUp(s.Addr, 30*time.Second); err != nil {
		t.Fatalf("redis cluster: %v\n%s", err, tailFile(s.dir+"/redis.log", 2000))
	}
	return s
}

// clusterUp gives the node at addr every hash slot and waits until it
// reports cluster_state:ok. It speaks RESP itself: this package does not
// depend on a Redis client.
func clusterUp(addr string, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	r := bufio.NewReader(c)
	command := func(args ...string) (string, error) {
		var b strings.Builder
		fmt.Fprintf(&b, "*%d\r\n", len(args))
		for _, a := range args {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
		}
		if _, err := c.Write([]byte(b.String())); err != nil {
			return "", err
		}
		line, err := r.ReadString('\n')
		if err != nil {
			return "", err
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case strings.HasPrefix(line, "-"):
			return "", errors.New(line[1:])
		case strings.HasPrefix(line, "$"): // bulk string
			n, err := strconv.Atoi(line[1:])
			if err != nil || n < 0 {
				return "", fmt.Errorf("unexpected reply %q", line)
			}
			buf := make([]byte, n+2)
			if _, err := io.ReadFull(r, buf); err != nil {
				return "", err
			}
			return string(buf[:n]), nil
		}
		return line, nil
	}
	if _, err := command("CLUSTER", "ADDSLOTSRANGE", "0", "16383"); err != nil {
		return fmt.Errorf("CLUSTER ADDSLOTSRANGE: %w", err)
	}
	deadline := time.Now().Add(timeout)
	for {
		info, err := command("CLUSTER", "INFO")
		if err != nil {
			return fmt.Errorf("CLUSTER INFO: %w", err)
		}
		if strings.Contains(info, "cluster_state:ok") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster not up within %v:\n%s", timeout, info)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// StartRedis starts a private redis-server (well under a second) and waits
// until it accepts connections. It is stopped when the test ends. Without
// redis-server the test is skipped (failed under CI=true).
func StartRedis(t testing.TB) *RedisServer {
	t.Helper()
	s := newRedisServer(t)
	if s != nil {
		s.Start(t)
	}
	return s
}

// newRedisServer returns a private server not yet started, on a free port,
// killed when the test ends; nil (the test skipped) without redis-server.
func newRedisServer(t testing.TB) *RedisServer {
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
	return s
}

// Start starts the server (again, after Stop) empty and waits until it
// accepts connections.
func (s *RedisServer) Start(t testing.TB) {
	t.Helper()
	if p := s.current(); p != nil && !p.exited() {
		t.Fatal("redis: already running")
	}
	args := []string{"--port", fmt.Sprint(s.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--daemonize", "no", "--protected-mode", "yes"}
	if s.busPort != 0 {
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", s.dir+"/nodes.conf",
			"--cluster-port", fmt.Sprint(s.busPort))
	}
	cmd := exec.Command(s.bin, args...)
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
