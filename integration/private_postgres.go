package integration

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// PostgresServer is a private PostgreSQL cluster a test owns: initdb in a
// temporary directory, a free loopback port, trust authentication for the
// user postgres and a database named test. PostgreSQL refuses to run as
// root, so when the tests run as root the cluster runs as the unprivileged
// user nobody.
//
// Stop, Kill and Start may be called in any order while the test runs; the
// cluster keeps its data across them.
type PostgresServer struct {
	// DSN connects to the database test as postgres.
	DSN string
	// Port is the TCP port on 127.0.0.1.
	Port int

	dir  string // the data directory
	bin  string // the directory holding postgres, initdb, pg_ctl
	cred *syscall.Credential
	server
}

// Shutdown modes of PostgresServer.Stop, as pg_ctl names them.
const (
	// PostgresFast disconnects clients, rolls back their transactions and
	// shuts down cleanly (SIGINT).
	PostgresFast = "fast"
	// PostgresImmediate quits at once without a checkpoint (SIGQUIT): the
	// next start runs crash recovery.
	PostgresImmediate = "immediate"
)

// postgresBin finds the directory of the PostgreSQL server binaries
// (BERTH_PG_BIN, else the newest /usr/lib/postgresql/*/bin, else initdb in PATH).
func postgresBin() (string, error) {
	if d := os.Getenv("BERTH_PG_BIN"); d != "" {
		return d, nil
	}
	initdb, err := findBinary("initdb", "/usr/lib/postgresql/*/bin/initdb", "/usr/local/pgsql/bin/initdb")
	if err != nil {
		return "", err
	}
	return filepath.Dir(initdb), nil
}

// unprivileged returns the credential to run PostgreSQL with when this
// process is root (nobody), else nil.
func unprivileged() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		return nil, fmt.Errorf("running as root and no user nobody to run PostgreSQL as: %w", err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("user nobody: uid %q gid %q", u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

// StartPostgres initialises and starts a private PostgreSQL cluster (about a
// second) and waits until it accepts connections. It is stopped and its files
// removed when the test ends. Without the PostgreSQL server binaries the test
// is skipped (failed under CI=true).
func StartPostgres(t testing.TB) *PostgresServer {
	t.Helper()
	bin, err := postgresBin()
	if err != nil {
		missing(t, "PostgreSQL", err)
		return nil
	}
	cred, err := unprivileged()
	if err != nil {
		missing(t, "PostgreSQL", err)
		return nil
	}
	// Not t.TempDir: its parent is private to root, and nobody must reach it.
	base, err := os.MkdirTemp("", "berth-postgres-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	if cred != nil {
		if err := os.Chown(base, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	s := &PostgresServer{
		DSN:  fmt.Sprintf("postgres://postgres@127.0.0.1:%d/test?sslmode=disable", port),
		Port: port, dir: filepath.Join(base, "data"), bin: bin, cred: cred,
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", s.dir, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Dir = base
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	conf := fmt.Sprintf("port = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\nfsync = off\nmax_connections = 200\nlog_min_messages = warning\n", port)
	f, err := os.OpenFile(filepath.Join(s.dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p := s.current(); p != nil {
			p.stop(syscall.SIGQUIT, 10*time.Second)
		}
	})
	s.Start(t)
	if out, err := s.run("psql", "-h", "127.0.0.1", "-p", fmt.Sprint(port), "-U", "postgres", "-d", "postgres", "-qc", "CREATE DATABASE test"); err != nil {
		t.Fatalf("create database test: %v\n%s", err, out)
	}
	return s
}

func (s *PostgresServer) run(name string, args ...string) ([]byte, error) {
	path := filepath.Join(s.bin, name)
	if _, err := os.Stat(path); err != nil {
		path = name // psql is often only in PATH
	}
	cmd := exec.Command(path, args...)
	cmd.Dir = filepath.Dir(s.dir)
	return cmd.CombinedOutput()
}

// Start starts the server (again, after Stop or Kill) and waits until it
// accepts connections; after an immediate stop or a kill that includes crash
// recovery.
func (s *PostgresServer) Start(t testing.TB) {
	t.Helper()
	if p := s.current(); p != nil && !p.exited() {
		t.Fatal("postgres: already running")
	}
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), "-D", s.dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	cmd.Dir = filepath.Dir(s.dir)
	logPath := filepath.Join(filepath.Dir(s.dir), "postgres.log")
	p, err := startProc(cmd, logPath)
	if err != nil {
		t.Fatalf("start postgres: %v", err)
	}
	s.set(p)
	if err := s.waitReady(p, 60*time.Second); err != nil {
		p.stop(syscall.SIGQUIT, 5*time.Second)
		t.Fatalf("postgres: %v\n%s", err, tailFile(logPath, 2000))
	}
}

// waitReady waits until the server accepts queries (a listening socket is
// not enough: during recovery it answers "the database system is starting up").
func (s *PostgresServer) waitReady(p *proc, timeout time.Duration) error {
	if err := waitTCP(p, fmt.Sprintf("127.0.0.1:%d", s.Port), timeout); err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		out, err := s.run("pg_isready", "-h", "127.0.0.1", "-p", fmt.Sprint(s.Port), "-U", "postgres", "-d", "postgres", "-t", "2")
		if err == nil {
			return nil
		}
		if p.exited() || time.Now().After(deadline) {
			return fmt.Errorf("not ready: %v %s", err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop shuts the server down in mode (PostgresFast or PostgresImmediate) and
// waits until it is gone.
func (s *PostgresServer) Stop(t testing.TB, mode string) {
	t.Helper()
	sig := syscall.SIGINT
	switch mode {
	case PostgresFast:
	case PostgresImmediate:
		sig = syscall.SIGQUIT
	default:
		t.Fatalf("postgres: unknown shutdown mode %q", mode)
	}
	if p := s.current(); p != nil {
		p.stop(sig, 30*time.Second)
	}
}

// Restart stops the server in mode and starts it again.
func (s *PostgresServer) Restart(t testing.TB, mode string) {
	t.Helper()
	s.Stop(t, mode)
	s.Start(t)
}

// Kill SIGKILLs every process of the server, as a crashed machine would.
func (s *PostgresServer) Kill(t testing.TB) {
	t.Helper()
	if p := s.current(); p != nil {
		p.stop(syscall.SIGKILL, 10*time.Second)
	}
}
