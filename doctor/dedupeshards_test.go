package doctor_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/integration"
)

// TestDedupeTTLOnEveryShard: on a sharded Redis (a redis.Ring; a cluster
// likewise) go-redis sends each SCAN to one shard, the one its cursor
// hashes to as if it were a key, so the dedupe check read the keys of the
// shard of "0" (and, on a large keyspace, of whichever shard each next
// cursor named) and called its scan complete: keys without a TTL on
// another shard were reported as fine. Each shard's keys are sampled with
// its own cursor: the keys either shard keeps forever are found.
func TestDedupeTTLOnEveryShard(t *testing.T) {
	a, b := integration.StartRedis(t), integration.StartRedis(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr, "b": b.Addr}})
	defer ring.Close()
	ctx := testCtx(t)
	prefix := "berth:idem:"
	keys := make([]string, 40)
	for i := range keys {
		keys[i] = fmt.Sprintf("%sk%d", prefix, i)
	}
	for _, shard := range []*integration.RedisServer{a, b} {
		// Through the ring, as redisstore writes them: each on its shard,
		// with a TTL; then those of one shard lose it.
		for _, k := range keys {
			if err := ring.Set(ctx, k, "fp", 7*24*time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
		}
		direct := redis.NewClient(&redis.Options{Addr: shard.Addr})
		on, err := direct.Keys(ctx, prefix+"*").Result()
		if err == nil && (len(on) == 0 || len(on) == len(keys)) {
			err = fmt.Errorf("%d of %d keys on shard %s: want them spread", len(on), len(keys), shard.Addr)
		}
		for _, k := range on {
			if err == nil {
				err = direct.Persist(ctx, k).Err()
			}
		}
		_ = direct.Close()
		if err != nil {
			t.Fatal(err)
		}
		fs, err := doctor.Dedupe(ctx, ring, prefix, doctor.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("keys kept forever on %s: %s", shard.Addr, find(fs, "idempotency.dedupe-ttl", "")[0].Evidence)
		expect(t, fs, "idempotency.dedupe-ttl", prefix+"*", doctor.Warn)
	}
}
