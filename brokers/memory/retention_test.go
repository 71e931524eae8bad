package memory_test

import (
	"errors"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

var errFlaky = errors.New("flaky")

// liveHeap is the heap in use after a full collection.
func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// TestStragglerLetsItsBatchGo: Publish keeps a batch's messages in one
// array and their bodies in another. A message that stays behind — retried
// or released for an hour, or published with a Delay beside messages
// published without — must not keep the rest of its batch, acked long ago,
// in memory with it: before, one 256 KiB message retried for an hour held
// the whole 25 MiB batch for that hour (and for ever, released again and
// again, as RetryUnknown does).
func TestStragglerLetsItsBatchGo(t *testing.T) {
	const n, size = 100, 256 << 10 // a 25 MiB batch
	for _, stay := range []string{"retry", "release", "delayed-publish"} {
		t.Run(stay, func(t *testing.T) {
			ctx := ctxT(t)
			b := newBroker(t, memory.Options{MaxMessageSize: -1})
			body := make([]byte, size) // shared by the messages: Publish copies it
			before := liveHeap()
			msgs := make([]*sdk.Message, n)
			for i := range msgs {
				msgs[i] = &sdk.Message{Type: "t", Body: body}
			}
			if stay == "delayed-publish" {
				msgs[n/2].Delay = time.Hour
			}
			if err := b.Publish(ctx, "q", msgs...); err != nil {
				t.Fatal(err)
			}
			msgs = nil
			want := n
			if stay == "delayed-publish" {
				want = n - 1
			}
			for got := 0; got < want; {
				ds, err := b.Receive(ctx, "q", want-got)
				if err != nil {
					t.Fatal(err)
				}
				for _, d := range ds {
					got++
					switch {
					case got == n/2 && stay == "retry":
						err = d.Retry(ctx, time.Hour, errFlaky)
					case got == n/2 && stay == "release":
						err = d.(sdk.Releaser).Release(ctx, time.Hour)
					default:
						err = d.Ack(ctx)
					}
					if err != nil {
						t.Fatal(err)
					}
				}
			}
			kept := liveHeap() - before
			if s, err := b.Stats(ctx, "q"); err != nil || s.Delayed != 1 || s.Ready != 0 || s.InFlight != 0 {
				t.Fatalf("Stats = %+v, %v; want the one message delayed", s, err)
			}
			// One message (256 KiB) and change, not the batch (25 MiB).
			if limit := int64(4 * size); kept > limit {
				t.Errorf("%d KiB kept by the one message left of the batch, want at most %d KiB", kept>>10, limit>>10)
			}
			runtime.KeepAlive(body)
		})
	}
}

// TestDelayedBatchKeepsPublishOrder: messages published together with the
// same Delay become ready at the same time and reach a single receiver in
// publish order, as the package doc says of messages published together.
// The delayed heap, ordered by due time alone, handed them out in an order
// of its own: 0, 19, 18, …, 1.
func TestDelayedBatchKeepsPublishOrder(t *testing.T) {
	ctx := ctxT(t)
	b := newBroker(t, memory.Options{})
	const n = 20
	msgs := make([]*sdk.Message, n)
	for i := range msgs {
		msgs[i] = &sdk.Message{Type: "t", Key: "k", Delay: 50 * time.Millisecond}
		msgs[i].SetHeader("x-seq", strconv.Itoa(i))
	}
	if err := b.Publish(ctx, "q", msgs...); err != nil {
		t.Fatal(err)
	}
	// Retried together with one delay, they come back in the order they
	// were retried too.
	var got []string
	for round := range 2 {
		got = got[:0]
		var ds []sdk.Delivery
		for len(ds) < n {
			more, err := b.Receive(ctx, "q", n-len(ds))
			if err != nil {
				t.Fatal(err)
			}
			ds = append(ds, more...)
		}
		for _, d := range ds {
			got = append(got, d.Message().Header("x-seq"))
			var err error
			if round == 0 {
				err = d.Retry(ctx, 50*time.Millisecond, errFlaky)
			} else {
				err = d.Ack(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		for i, s := range got {
			if s != strconv.Itoa(i) {
				t.Fatalf("round %d: order %v, want publish order", round, got)
			}
		}
	}
}
