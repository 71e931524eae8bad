package doctor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/berthq/berth/integration"
)

// scanCounter counts the SCAN commands a client sends.
type scanCounter struct{ n atomic.Int32 }

func (c *scanCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *scanCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.EqualFold(cmd.Name(), "scan") {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (c *scanCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestDedupeScanIsBounded: the dedupe check scanned until the cursor came
// back to 0, so on a large Redis whose keys were mostly not the cache's it
// read keys for the whole check timeout and then reported a timeout
// instead of a result. The scan stops after dedupeScanCalls SCAN calls and
// the finding says it is a sample of a scan that stopped; a scan that
// reaches the end of the keyspace says nothing of the kind.
func TestDedupeScanIsBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: integration.RedisAddr(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	var sfx [6]byte
	_, _ = rand.Read(sfx[:])
	base := "berth:doctorscan:" + hex.EncodeToString(sfx[:]) + ":"
	prefix := base + "idem:"
	// More keys than the lowered bound examines, nearly all of them other
	// data: the cache's keys are sparse in the keyspace. They expire on
	// their own should the cleanup not run.
	const fill, cached = 3000, 3
	var all []string
	pipe := rdb.Pipeline()
	for i := range fill {
		k := fmt.Sprintf("%sfill:%d", base, i)
		all = append(all, k)
		pipe.Set(ctx, k, "x", 10*time.Minute)
	}
	for i := range cached {
		k := fmt.Sprintf("%s%d", prefix, i)
		all = append(all, k)
		pipe.Set(ctx, k, "x", 0) // no TTL: a Warn when found
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for i := 0; i < len(all); i += 500 {
			rdb.Unlink(ctx, all[i:min(i+500, len(all))]...)
		}
	})
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	n, err := rdb.DBSize(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}

	counter := &scanCounter{}
	rdb.AddHook(counter)
	old := dedupeScanCalls
	dedupeScanCalls = 3
	t.Cleanup(func() { dedupeScanCalls = old })
	fs, err := Dedupe(ctx, rdb, prefix, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if c := counter.n.Load(); c > 3 {
		t.Fatalf("%d SCAN calls on a keyspace of %d keys, want at most the bound (3)", c, n)
	}
	if len(fs) != 1 || fs[0].ID != "idempotency.dedupe-ttl" {
		t.Fatalf("findings %+v, want the dedupe-ttl finding", fs)
	}
	f := fs[0]
	if !strings.Contains(f.Evidence, "SCAN stopped after 3 calls") {
		t.Errorf("evidence %q: want the stopped scan said", f.Evidence)
	}
	switch f.Severity {
	case Warn: // found some of the keys without a TTL
		if !strings.Contains(f.Evidence, "at least ") {
			t.Errorf("evidence %q: want the count given as a lower bound", f.Evidence)
		}
	case Info: // found none in the part scanned
		if !strings.Contains(f.Summary, "part of Redis scanned") {
			t.Errorf("summary %q: want it said that only part of Redis was scanned", f.Summary)
		}
	default:
		t.Errorf("finding %+v: want Warn (keys without a TTL found) or Info (none found)", f)
	}

	// The whole keyspace scanned: every key found, the usual wording.
	dedupeScanCalls = old
	if int64(old)*dedupeScanCount < 2*n {
		t.Skipf("keyspace of %d keys too large for the default bound to reach its end", n)
	}
	fs, err = Dedupe(ctx, rdb, prefix, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 1 || fs[0].Severity != Warn || strings.Contains(fs[0].Evidence, "stopped") || strings.Contains(fs[0].Evidence, "at least") ||
		!strings.HasPrefix(fs[0].Evidence, fmt.Sprintf("%d keys sampled: %d without a TTL", cached, cached)) {
		t.Errorf("full scan: findings %+v, want Warn with all %d keys sampled", fs, cached)
	}
}
