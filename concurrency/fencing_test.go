package concurrency_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/concurrency/fence"
	"github.com/berthq/berth/concurrency/internal/testenv"
	"github.com/berthq/berth/concurrency/redislock"
	"github.com/berthq/berth/integration"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// helperEnv selects the role of a re-exec'd test binary.
const helperEnv = "BERTH_CONCURRENCY_HELPER"

// TestPausedLockHolderIsFenced: a child process takes a Redis lock (TTL
// 300ms, no watchdog: a holder that does not notice it is paused) and is
// stopped with SIGSTOP before its write. The lock expires; the test takes it
// with a higher fencing token and writes. The child is resumed with SIGCONT
// and makes its write with its old token: the database refuses it.
func TestPausedLockHolderIsFenced(t *testing.T) {
	pool, schema := pgtest.Schema(t, 2)
	pgtest.Exec(t, pool,
		`CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL, fence_token bigint)`,
		`INSERT INTO accounts (id, balance) VALUES (1, 0)`)
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		helperEnv+"=fenced-writer",
		"BERTH_POSTGRES_DSN="+integration.PostgresDSN(t),
		"BERTH_REDIS_ADDR="+integration.RedisAddr(t),
		"CONC_SCHEMA="+schema,
		"CONC_PREFIX="+prefix)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	child, lines := integration.StartChildLines(t, cmd) // dies with this test, and with this process
	line := func() string {
		for l := range lines {
			if s, ok := strings.CutPrefix(l, "CHILD "); ok {
				return s
			}
		}
		t.Fatal("child exited early")
		return ""
	}
	var childToken int64
	said := line()
	if _, err := fmt.Sscanf(said, "LOCKED %d", &childToken); err != nil {
		t.Fatalf("child said %q, want LOCKED <token>: %v", said, err)
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// kill(2) returns before the child is stopped: the kernel wakes one of
	// its threads to start the group stop, and until that thread has run,
	// another (the one reading stdin) can take the "go" below and write.
	// Under load it did: the paused holder's write went in before the new
	// holder's. Wait for the stop itself, as a shell's job control does.
	waitStopped(t, cmd.Process.Pid)
	// Queue the child's "go" while it is stopped: it reads it on resume.
	if _, err := io.WriteString(stdin, "GO\n"); err != nil {
		t.Fatal(err)
	}

	locks, err := redislock.New(rdb, redislock.Options{Prefix: prefix, TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var l *redislock.Lock
	for l == nil { // until the paused child's lock has expired
		if l, err = locks.Obtain(ctx, "account:1"); err != nil && !errors.Is(err, redislock.ErrBusy) {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer l.Release(ctx)
	if l.Token() <= childToken {
		t.Fatalf("new holder's token %d not above the paused holder's %d", l.Token(), childToken)
	}
	f, err := fence.New(fence.Options{Table: "accounts"})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Update(ctx, pool, 1, l.Token(), map[string]any{"balance": 222}); err != nil {
		t.Fatal(err)
	}

	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if got := line(); got != "REFUSED" {
		t.Errorf("paused holder's write: %s, want REFUSED", got)
	}
	if err := child.Wait(); err != nil {
		t.Errorf("child: %v", err)
	}
	var balance, token int64
	if err := pool.QueryRow(ctx, "SELECT balance, fence_token FROM accounts WHERE id = 1").Scan(&balance, &token); err != nil {
		t.Fatal(err)
	}
	if balance != 222 || token != l.Token() {
		t.Errorf("row = balance %d token %d, want the new holder's 222 and %d", balance, token, l.Token())
	}
}

// waitStopped returns once the child pid has stopped (its group stop is
// complete: every thread is stopped), without reaping it.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	for {
		var ws syscall.WaitStatus
		wpid, err := syscall.Wait4(pid, &ws, syscall.WUNTRACED, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			t.Fatalf("waiting for the child to stop: %v", err)
		}
		if wpid != pid || !ws.Stopped() {
			t.Fatalf("waiting for the child to stop: pid %d status %v", wpid, ws)
		}
		return
	}
}

// helperProcess is the child of TestPausedLockHolderIsFenced, run by TestMain
// instead of the tests when helperEnv is set. It never returns.
func helperProcess() {
	err := fencedWriter()
	if err != nil {
		fmt.Printf("CHILD ERROR %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func fencedWriter() error {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("BERTH_POSTGRES_DSN"))
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = os.Getenv("CONC_SCHEMA")
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil { // connect before the pause
		return err
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("BERTH_REDIS_ADDR")})
	defer rdb.Close()
	locks, err := redislock.New(rdb, redislock.Options{Prefix: os.Getenv("CONC_PREFIX"), TTL: 300 * time.Millisecond})
	if err != nil {
		return err
	}
	f, err := fence.New(fence.Options{Table: "accounts"})
	if err != nil {
		return err
	}
	l, err := locks.Obtain(ctx, "account:1")
	if err != nil {
		return err
	}
	fmt.Println("CHILD LOCKED " + strconv.FormatInt(l.Token(), 10))
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	// Resumed: the holder believes it still holds the lock and writes.
	err = f.Update(ctx, pool, 1, l.Token(), map[string]any{"balance": 111})
	switch {
	case errors.Is(err, fence.ErrStaleToken):
		fmt.Println("CHILD REFUSED")
	case err == nil:
		fmt.Println("CHILD WROTE")
	default:
		return err
	}
	return nil
}
