package redislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/berthq/berth/concurrency/redislock"
	"github.com/berthq/berth/integration"
)

// On Redis Cluster a lock's keys (the lock, its fencing counter, its
// release marker) must share a hash slot: the scripts name them together.
// The slot comes from the first "{...}" of a key. A resource name starting
// with "}" closed berth's tag at once, the empty tag does not count, each
// key was hashed whole, and every Obtain failed with CROSSSLOT: a job about
// that resource could never run. Names with braces elsewhere, and names
// that look like the encoding of another, keep distinct locks and tokens.
func TestClusterResourceNamesWithBraces(t *testing.T) {
	srv := integration.StartRedisCluster(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr}})
	defer rdb.Close()
	ctx := context.Background()
	c := newClient(t, rdb, "berthtest:lock:", redislock.Options{TTL: time.Minute})

	names := []string{"}", "}order:1", "}}", "order}1", "{order:1}", "{", "{}", "a{b}c", "7d", "7d6f726465723a31", "order:1"}
	held := make([]*redislock.Lock, 0, len(names))
	for _, name := range names {
		l, err := c.Obtain(ctx, name)
		if err != nil {
			t.Errorf("Obtain(%q) = %v", name, err)
			continue
		}
		if l.Token() != 1 {
			t.Errorf("Obtain(%q): token %d, want 1: another name's counter", name, l.Token())
		}
		if err := l.Extend(ctx); err != nil {
			t.Errorf("Extend(%q) = %v", name, err)
		}
		held = append(held, l)
	}
	// Every name is its own lock: all are held at once, and each is busy.
	for _, name := range names {
		if _, err := c.Obtain(ctx, name); !errors.Is(err, redislock.ErrBusy) {
			t.Errorf("second Obtain(%q) = %v, want busy", name, err)
		}
	}
	for _, l := range held {
		if err := l.Release(ctx); err != nil {
			t.Errorf("Release(%q) = %v", l.Resource(), err)
		}
	}
	// Run, which uses the same keys, and the next token.
	err := c.Run(ctx, "}order:1", func(ctx context.Context, l *redislock.Lock) error {
		if l.Token() != 2 {
			t.Errorf("Run: token %d, want 2", l.Token())
		}
		return nil
	})
	if err != nil {
		t.Errorf("Run = %v", err)
	}
}
