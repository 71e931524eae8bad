package doctor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/integration"
)

// TestRedisReadTimeoutNamesItsFigure: a Redis that does not answer ends
// the dedupe check on the client's read timeout, well before the check's
// own deadline; the finding said the check "did not answer within" the
// check timeout (here 1m), a figure that had nothing to do with it (and
// raising -check-timeout would change nothing). It names the client's read
// timeout and its figure.
func TestRedisReadTimeoutNamesItsFigure(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: integration.SilentServer(t), ReadTimeout: 150 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fs, err := doctor.Run(ctx, b, doctor.Options{Redis: rdb, CheckTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	got := find(fs, "doctor.check-timeout", "berth:idem:*")
	if len(got) != 1 {
		t.Fatalf("check-timeout findings %+v, want one for the dedupe cache", fs)
	}
	f := got[0]
	if want := "the Redis dedupe cache checks did not answer within the Redis client's read timeout (150ms): not checked"; f.Summary != want {
		t.Errorf("summary %q, want %q", f.Summary, want)
	}
	if strings.Contains(f.Summary+f.Fix, "1m0s") || strings.Contains(f.Fix, "-check-timeout") || !strings.Contains(f.Fix, "read timeout") {
		t.Errorf("fix %q: want the client's read timeout raised, not the check's", f.Fix)
	}
	if !strings.Contains(f.Evidence, "i/o timeout") {
		t.Errorf("evidence %q, want the client's error", f.Evidence)
	}
}
