package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
)

// advFlaky refuses a random third of its Publish calls (a refusal, not an
// outage) and records, in order, what it accepted.
type advFlaky struct {
	mu       sync.Mutex
	accepted []*sdk.Message
}

func (f *advFlaky) Publish(ctx context.Context, q string, msgs ...*sdk.Message) error {
	time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
	f.mu.Lock()
	defer f.mu.Unlock()
	if rand.IntN(3) == 0 {
		return errors.New("refused")
	}
	f.accepted = append(f.accepted, msgs...)
	return nil
}

func (f *advFlaky) Close() error { return nil }

// Relays side by side keep each ordering key's order while the broker refuses
// calls at random: a refused row and the later rows of its key are retried,
// never overtaken (dropOvertaking plus the held-back EXISTS), and every row
// is accepted once.
func TestConcurrentRelaysKeepKeyOrderUnderRefusals(t *testing.T) {
	ctx := context.Background()
	pool, box, _ := setup(t)
	const keys, perKey = 4, 30
	for i := range perKey {
		var msgs []*sdk.Message
		for k := range keys {
			msgs = append(msgs, &sdk.Message{Key: fmt.Sprint("k", k), Body: []byte(fmt.Sprint(i))})
		}
		add(t, pool, box, "q", msgs...)
	}
	pub := &advFlaky{}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = box.Relay(rctx, pub, outbox.RelayOptions{BatchSize: 5, PollInterval: time.Millisecond, MaxAttempts: 1000,
				Backoff: sdk.Backoff{Base: time.Millisecond, Max: 3 * time.Millisecond, Jitter: -1}})
		}()
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		n, err := box.Pending(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	next := map[string]int{}
	pub.mu.Lock()
	defer pub.mu.Unlock()
	for _, m := range pub.accepted {
		if want := fmt.Sprint(next[m.Key]); string(m.Body) != want {
			t.Errorf("key %s: got row %s, want %s", m.Key, m.Body, want)
		}
		next[m.Key]++
	}
	if len(pub.accepted) != keys*perKey {
		t.Errorf("accepted %d, want %d", len(pub.accepted), keys*perKey)
	}
}
