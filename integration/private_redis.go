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
	var err error
	if s.busPort, err = freePort(); err != nil {
		t.Fatal(err)
	}
	s.startCluster(t)
	return s
}

// startCluster starts a new cluster node (startNew) and gives it every
// hash slot.
func (s *RedisServer) startCluster(t testing.TB) {
	t.Helper()
	s.startNew(t)
	if err := clusterUp(s.Addr, 30*time.Second); err != nil {
		t.Fatalf("redis cluster: %v\n%s", err, tailFile(s.dir+"/redis.log", 2000))
	}
}

// clusterUp gives the node at addr every hash slot and waits until it
// reports cluster_state:ok. It speaks RESP itself: this package does not
// depend on a Redis client.
func clusterUp(addr string, timeout time.Duration) error {
	command, closeConn, err := dialRESP(addr, timeout)
	if err != nil {
		return err
	}
	defer closeConn()
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

// dialRESP connects to the Redis at addr for timeout and returns a
// function that sends a command and reads its reply (a simple or bulk
// string), and one that closes the connection. It speaks RESP itself:
// this package does not depend on a Redis client.
func dialRESP(addr string, timeout time.Duration) (command func(args ...string) (string, error), closeConn func(), err error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, nil, err
	}
	_ = c.SetDeadline(time.Now().Add(timeout))
	r := bufio.NewReader(c)
	command = func(args ...string) (string, error) {
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
	return command, func() { _ = c.Close() }, nil
}

// StartRedis starts a private redis-server (well under a second) and waits
// until it accepts connections. It is stopped when the test ends. Without
// redis-server the test is skipped (failed under CI=true).
func StartRedis(t testing.TB) *RedisServer {
	t.Helper()
	s := newRedisServer(t)
	if s != nil {
		s.startNew(t)
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
	if err := s.start(); err != nil {
		t.Fatalf("redis: %v\n%s", err, tailFile(s.dir+"/redis.log", 2000))
	}
}

// errPortTaken: another process bound the server's port or cluster bus
// port between freePort and the server's start.
var errPortTaken = errors.New("port taken by another process")

// startNew starts a server never started before. freePort keeps a port
// apart only in this process: a server of another test process can bind
// it first. Then the server exits ("Address already in use"), or what
// answers at Addr is the other one (a client's command to a cluster bus
// port had its connection reset), and startNew starts it again on new
// ports, up to five times.
func (s *RedisServer) startNew(t testing.TB) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		err := s.start()
		if err == nil {
			return
		}
		if !errors.Is(err, errPortTaken) || attempt == 5 {
			t.Fatalf("redis: %v\n%s", err, tailFile(s.dir+"/redis.log", 2000))
		}
		t.Logf("redis on port %d (cluster bus %d): %v; trying other ports", s.port, s.busPort, err)
		if s.port, err = freePort(); err != nil {
			t.Fatal(err)
		}
		s.Addr = fmt.Sprintf("127.0.0.1:%d", s.port)
		if s.busPort != 0 {
			if s.busPort, err = freePort(); err != nil {
				t.Fatal(err)
			}
			// The node wrote its ports there: start afresh.
			_ = os.Remove(s.dir + "/nodes.conf")
		}
	}
}

// start starts the server and waits until it answers at Addr as itself
// (the process ID INFO reports): a connection alone may reach another
// process listening on the port, or this one before it fails to bind its
// cluster bus port. The error wraps errPortTaken when another process has
// the port or the bus port.
func (s *RedisServer) start() error {
	args := []string{"--port", fmt.Sprint(s.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--daemonize", "no", "--protected-mode", "yes"}
	if s.busPort != 0 {
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", s.dir+"/nodes.conf",
			"--cluster-port", fmt.Sprint(s.busPort))
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Env = os.Environ()
	logPath := s.dir + "/redis.log"
	var logStart int64 // this start's output begins there
	if st, err := os.Stat(logPath); err == nil {
		logStart = st.Size()
	}
	p, err := startProc(cmd, logPath)
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	s.set(p)
	err = waitTCP(p, s.Addr, 30*time.Second)
	if err == nil {
		err = answersAs(s.Addr, p.cmd.Process.Pid, 30*time.Second)
	}
	if err == nil {
		return nil
	}
	// A server that failed to bind exits at once; give it the time to.
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
	}
	p.stop(syscall.SIGKILL, 5*time.Second)
	if errors.Is(err, errPortTaken) || strings.Contains(readFrom(logPath, logStart), "Address already in use") {
		return fmt.Errorf("%w: %w", errPortTaken, err)
	}
	return err
}

// answersAs checks that the Redis answering at addr is process pid.
func answersAs(addr string, pid int, timeout time.Duration) error {
	command, closeConn, err := dialRESP(addr, timeout)
	if err != nil {
		return err
	}
	defer closeConn()
	info, err := command("INFO", "server")
	if err != nil {
		return fmt.Errorf("INFO: %w", err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			if v != strconv.Itoa(pid) {
				return fmt.Errorf("%w: %s answers as process %s, not %d", errPortTaken, addr, v, pid)
			}
			return nil
		}
	}
	return fmt.Errorf("no process_id in INFO server at %s", addr)
}

// Stop stops the server (SIGTERM; nothing is saved) and waits until it is gone.
func (s *RedisServer) Stop(t testing.TB) {
	t.Helper()
	if p := s.current(); p != nil {
		p.stop(syscall.SIGTERM, 10*time.Second)
	}
}
