package rabbitmq

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// frames records the ack frames a broker's consumer channels send.
type frames struct {
	mu  sync.Mutex
	all []frame
}

type frame struct {
	tag      uint64
	multiple bool
}

func (f *frames) hook(tag uint64, multiple bool) {
	f.mu.Lock()
	f.all = append(f.all, frame{tag, multiple})
	f.mu.Unlock()
}

func (f *frames) get() []frame {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]frame(nil), f.all...)
}

// recordingBroker is a broker whose ack frames f records.
func recordingBroker(t *testing.T, url string, opts Options) (*Broker, *frames) {
	t.Helper()
	b := newBroker(t, url, opts)
	f := &frames{}
	b.ackHook = f.hook // before the first Receive starts a consumer
	return b, f
}

// receiveAll receives n deliveries of q.
func receiveAll(t *testing.T, ctx context.Context, b *Broker, q string, n int) []*delivery {
	t.Helper()
	var out []*delivery
	for len(out) < n {
		ds, err := b.Receive(ctx, q, n-len(out))
		if err != nil {
			t.Fatalf("Receive: %v (after %d of %d)", err, len(out), n)
		}
		for _, d := range ds {
			out = append(out, d.(*delivery))
		}
	}
	return out
}

func publishN(t *testing.T, ctx context.Context, b *Broker, q, typ string, n int) []*sdk.Message {
	t.Helper()
	msgs := make([]*sdk.Message, n)
	for i := range msgs {
		msgs[i] = &sdk.Message{Type: typ, Body: []byte(strconv.Itoa(i))}
	}
	if err := b.Publish(ctx, q, msgs...); err != nil {
		t.Fatal(err)
	}
	return msgs
}

// expectBack kills the consumer channel of ds (no flush: as a process
// would die) and checks that exactly want come back, each at attempt
// wantAttempt, and nothing else within a second.
func expectBack(t *testing.T, ctx context.Context, b *Broker, q string, st *chanState, want map[string]bool, wantAttempt int) {
	t.Helper()
	// RabbitMQ applies a quorum queue's acks asynchronously: a channel
	// closed right after them requeues some (see handBack). Let the server
	// apply the acks that were sent; those that were not stay unsent.
	// Nothing in AMQP 0-9-1 tells when it has, so this is a pause: a second,
	// not the 200 ms it was, because a quorum queue's WAL fsync on a disk
	// shared with the other packages' tests can take that long, and an ack
	// still held back when the channel closes is dropped.
	time.Sleep(time.Second)
	_ = st.ch.Close()
	st.kill()
	left := map[string]bool{}
	for id := range want {
		left[id] = true
	}
	deadline := time.Now().Add(time.Second)
	for len(left) > 0 || time.Now().Before(deadline) {
		rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		ds, err := b.Receive(rctx, q, 100)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			if ctx.Err() != nil {
				t.Fatalf("still waiting for %v", left)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			id := d.Message().ID
			switch {
			case !want[id]:
				t.Errorf("message %s (%s) came back: its ack was sent, or it was acked on the wrong channel", id, d.Message().Body)
			case !left[id]:
				t.Errorf("message %s came back twice", id)
			case d.Attempt() != wantAttempt:
				t.Errorf("message %s back at attempt %d, want %d", id, d.Attempt(), wantAttempt)
			}
			delete(left, id)
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestAckCoalescesOutOfOrder: acks that complete out of order within a
// window go out as a few multiple acks, not one frame each, and every
// message is acked (none comes back when the channel dies after Flush).
func TestAckCoalescesOutOfOrder(t *testing.T) {
	url := serverURL(t)
	q := testQueue(t, url)
	b, f := recordingBroker(t, url, Options{Prefetch: 100, AckInterval: time.Hour, Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const n = 100
	publishN(t, ctx, b, q, "coalesce", n)
	ds := receiveAll(t, ctx, b, q, n)
	// Completion order: shuffled within windows of 10, as 10 concurrent
	// handlers finish.
	r := rand.New(rand.NewPCG(1, 2))
	for w := 0; w < n; w += 10 {
		win := ds[w : w+10]
		r.Shuffle(len(win), func(i, j int) { win[i], win[j] = win[j], win[i] })
		for _, d := range win {
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	fs := f.get()
	if len(fs) > n/5 {
		t.Errorf("%d ack frames for %d acks, want at most %d: %v", len(fs), n, n/5, fs)
	}
	expectBack(t, ctx, b, q, ds[0].st, nil, 0)
}

// TestAckNeverCoversUnsettled: with two deliveries held by their
// "handlers" for the whole test, no multiple ack reaches them, whatever
// order the others are acked in; the held two, and only they, come back
// when the channel dies.
func TestAckNeverCoversUnsettled(t *testing.T) {
	url := serverURL(t)
	q := testQueue(t, url)
	b, f := recordingBroker(t, url, Options{Prefetch: 40, AckInterval: time.Hour, Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const n = 40
	publishN(t, ctx, b, q, "held", n)
	ds := receiveAll(t, ctx, b, q, n)
	held := map[string]bool{ds[3].msg.ID: true, ds[17].msg.ID: true}
	heldTags := map[uint64]bool{ds[3].tag: true, ds[17].tag: true}
	low := min(ds[3].tag, ds[17].tag)
	rest := append([]*delivery(nil), ds...)
	rand.New(rand.NewPCG(3, 4)).Shuffle(len(rest), func(i, j int) { rest[i], rest[j] = rest[j], rest[i] })
	for _, d := range rest {
		if held[d.msg.ID] {
			continue
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for _, fr := range f.get() {
		if fr.multiple && fr.tag >= low || heldTags[fr.tag] {
			t.Errorf("ack frame %+v covers a held delivery (tags %v)", fr, heldTags)
		}
	}
	expectBack(t, ctx, b, q, ds[0].st, held, 2)
}

// TestAckAcrossReconnect: acks waiting when the connection is cut are lost
// with it (the messages come back: at least once), a settlement of an old
// delivery reports ErrLeaseLost, and nothing of the old channel is acked on
// the new one, whose delivery tags start at 1 again.
func TestAckAcrossReconnect(t *testing.T) {
	url := serverURL(t)
	p, purl := newProxy(t, url)
	q := testQueue(t, url)
	b, f := recordingBroker(t, purl, Options{Prefetch: 40, AckInterval: time.Hour, Logger: quiet,
		Reconnect: sdk.Backoff{Base: 20 * time.Millisecond, Max: 100 * time.Millisecond}})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const n = 5
	publishN(t, ctx, b, q, "reconnect", n)
	old := receiveAll(t, ctx, b, q, n)
	for _, d := range old[:2] {
		if err := d.Ack(ctx); err != nil { // recorded, not sent: the interval is an hour
			t.Fatal(err)
		}
	}
	p.Cut()
	for !errors.Is(old[4].ExtendLease(ctx, time.Second), sdk.ErrLeaseLost) {
		if ctx.Err() != nil {
			t.Fatal("the broker never noticed the cut")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := old[2].Ack(ctx); !errors.Is(err, sdk.ErrLeaseLost) {
		t.Errorf("Ack of a delivery of the dead channel: %v, want ErrLeaseLost", err)
	}
	if err := sdk.AckAll(ctx, b, []sdk.Delivery{old[3]}); !errors.Is(err, sdk.ErrLeaseLost) {
		t.Errorf("AckAll of a delivery of the dead channel: %v, want ErrLeaseLost", err)
	}
	if fs := f.get(); len(fs) != 0 {
		t.Errorf("ack frames sent: %v, want none (the interval is an hour)", fs)
	}
	// Every message comes back on the new channel, tags 1..5 again, the two
	// acked before the cut included (their acks died with the connection).
	fresh := receiveAll(t, ctx, b, q, n)
	for _, d := range fresh {
		if d.Attempt() != 2 {
			t.Errorf("message %s back at attempt %d, want 2", d.msg.ID, d.Attempt())
		}
		if d.st == old[0].st {
			t.Fatal("redelivered on the old channel state")
		}
	}
	if err := b.Flush(ctx); err != nil { // nothing of the old channel may go out on the new one
		t.Fatal(err)
	}
	if fs := f.get(); len(fs) != 0 {
		t.Errorf("ack frames on the new channel before any new ack: %v", fs)
	}
	if err := fresh[4].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, d := range fresh[:4] {
		want[d.msg.ID] = true
	}
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	expectBack(t, ctx, b, q, fresh[0].st, want, 3)
}

// TestAckInterleavedWithRetryAndNack: a Retry (copy, then a coalesced ack),
// a failed Retry (basic.nack, sent at once) and plain acks interleaved on
// one channel with one delivery left unsettled: the channel is never
// closed by an ack of an unknown tag, the nacked message and the retry copy
// come back at attempt 2, the unsettled one when the channel dies, and no
// acked one ever.
func TestAckInterleavedWithRetryAndNack(t *testing.T) {
	url := serverURL(t)
	q := testQueue(t, url)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// The queue has the default topology; this broker never declares, so
	// its delay queues do not exist and a delayed Retry fails (nack).
	if err := newBroker(t, url, Options{Logger: quiet}).DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	b, f := recordingBroker(t, url, Options{NoDeclare: true, Prefetch: 40, AckInterval: time.Hour, Logger: quiet})
	publishN(t, ctx, b, q, "interleave", 8)
	ds := receiveAll(t, ctx, b, q, 8)
	mustOK := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	mustOK(ds[0].Ack(ctx))
	mustOK(ds[1].Retry(ctx, 0, errors.New("again"))) // copy straight to the queue, then ack
	if err := ds[2].Retry(ctx, time.Minute, errors.New("later")); !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("Retry to a missing delay queue: %v, want ErrNotFound (then a nack)", err)
	}
	mustOK(ds[3].Ack(ctx))
	mustOK(sdk.AckAll(ctx, b, []sdk.Delivery{ds[4], ds[6]})) // flushes: ds[5] unsettled between them
	mustOK(ds[7].Ack(ctx))
	mustOK(b.Flush(ctx))
	for _, fr := range f.get() {
		if fr.multiple && fr.tag >= ds[5].tag || fr.tag == ds[5].tag || fr.tag == ds[2].tag {
			t.Errorf("ack frame %+v covers the unsettled tag %d or the nacked tag %d", fr, ds[5].tag, ds[2].tag)
		}
	}
	// The copy of ds[1] and the requeued ds[2] come back now, on the same
	// channel (it is alive: no ack closed it).
	back := receiveAll(t, ctx, b, q, 2)
	got := map[string]int{}
	for _, d := range back {
		got[d.msg.ID] = d.Attempt()
		mustOK(d.Ack(ctx))
	}
	for _, d := range ds[1:3] {
		if got[d.msg.ID] != 2 {
			t.Errorf("message %s back at attempt %d, want 2 (got %v)", d.msg.ID, got[d.msg.ID], got)
		}
	}
	if back[0].st != ds[0].st {
		t.Error("the channel was replaced: an ack closed it")
	}
	mustOK(b.Flush(ctx))
	expectBack(t, ctx, b, q, ds[5].st, map[string]bool{ds[5].msg.ID: true}, 2)
}

// TestAckIntervalCrash: a consumer that dies within AckInterval of an Ack
// loses the ack, and the message comes back (at least once, its attempt
// counted); with SyncAck the ack is on the wire when Ack returns.
func TestAckIntervalCrash(t *testing.T) {
	url := serverURL(t)
	for _, sync := range []bool{false, true} {
		t.Run("SyncAck="+strconv.FormatBool(sync), func(t *testing.T) {
			q := testQueue(t, url)
			b, f := recordingBroker(t, url, Options{Prefetch: 40, AckInterval: time.Hour, SyncAck: sync, Logger: quiet})
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			publishN(t, ctx, b, q, "crash", 1)
			d := receiveAll(t, ctx, b, q, 1)[0]
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
			want := map[string]bool{d.msg.ID: true}
			if sync {
				want = nil
				if fs := f.get(); len(fs) != 1 || fs[0].tag != d.tag {
					t.Errorf("SyncAck: frames %v after Ack, want the one ack", fs)
				}
			}
			expectBack(t, ctx, b, q, d.st, want, 2)
		})
	}
}

// TestAckCoalescingUnderWorker runs a Worker with many concurrent handlers
// of random duration, a tenth of first attempts retried, on the default
// AckInterval: every message is handled to an ack exactly once more than
// its retries (an ack of an unknown or unfinished tag would close the
// channel and redeliver), and the acks take fewer frames than messages.
func TestAckCoalescingUnderWorker(t *testing.T) {
	url := serverURL(t)
	q := testQueue(t, url)
	b, f := recordingBroker(t, url, Options{Prefetch: 64, Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	const n = 2000
	publishN(t, ctx, b, q, "worker", n)
	var mu sync.Mutex
	seen := map[string][]int{}
	var acked atomic.Int64
	allDone := make(chan struct{})
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		id := d.Message().ID
		if r := rand.IntN(100); r < 5 {
			time.Sleep(time.Duration(r) * time.Millisecond)
		}
		mu.Lock()
		seen[id] = append(seen[id], d.Attempt())
		first := len(seen[id]) == 1
		mu.Unlock()
		if first && rand.IntN(10) == 0 {
			return errors.New("transient")
		}
		if acked.Add(1) == n {
			close(allDone)
		}
		return nil
	})
	w, err := sdk.NewWorker(b, h, sdk.WorkerOptions{Queue: q, Concurrency: 16, Logger: quiet,
		Retry: sdk.RetryPolicy{MaxAttempts: 5, Backoff: sdk.Backoff{Base: time.Millisecond, Max: time.Millisecond}}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- w.Run(wctx) }()
	select {
	case <-allDone:
	case <-ctx.Done():
		t.Fatalf("only %d of %d acked", acked.Load(), n)
	}
	stop()
	if err := <-errc; err != nil {
		t.Fatalf("Run: %v", err)
	}
	// Anything redelivered by a closed channel would arrive now.
	rctx, rcancel := context.WithTimeout(ctx, time.Second)
	ds, err := b.Receive(rctx, q, 10)
	rcancel()
	if err == nil {
		t.Errorf("%d deliveries after every message was acked, first %s", len(ds), ds[0].Message().ID)
	}
	mu.Lock()
	defer mu.Unlock()
	for id, attempts := range seen {
		for i, a := range attempts {
			if a != i+1 {
				t.Errorf("message %s handled at attempts %v, want 1, 2, ...: redelivered", id, attempts)
				break
			}
		}
	}
	if fs := f.get(); len(fs) >= n {
		t.Errorf("%d ack frames for %d messages: not coalesced", len(fs), n)
	}
	t.Logf("%d ack frames for %d messages", len(f.get()), n)
}
