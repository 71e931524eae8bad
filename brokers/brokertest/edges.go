package brokertest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// The cases of this file probe the edges of the contract: contexts already
// done, odd bytes, queues nobody declared, the driver's errors, several
// instances and queues at once, ordering keys, Close racing the other calls,
// and a connection cut in the middle of a run.

func testPublishCancelledContext(t *testing.T, e *env) {
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	expired, cancel2 := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
	defer cancel2()
	refused := map[string]bool{}
	for _, c := range []struct {
		ctx  context.Context
		want error
	}{{cancelled, context.Canceled}, {expired, context.DeadlineExceeded}} {
		m := textMessage("ctx-done-publish")
		err := e.b.Publish(c.ctx, e.q, m)
		if err != c.want { // ctx.Err() itself, as sdk.Publisher says: not wrapped
			t.Errorf("Publish with a context already done: %v, want ctx.Err() (%v)", err, c.want)
		}
		refused[m.ID] = true
	}
	// Stores nothing: only the message published afterwards arrives.
	marker := textMessage("after-ctx-done")
	e.publish(t, marker)
	ctx := e.ctx(t)
	seen := false
	for !seen {
		for _, d := range e.receive(t, 10) {
			id := d.Message().ID
			if refused[id] {
				t.Errorf("message %s was stored by a Publish whose context was done", id)
			} else if id == marker.ID {
				seen = true
			}
			settleAck(t, ctx, d)
		}
	}
	e.expectNone(t, e.h.Lease/2)
}

func testReceiveCancelledContext(t *testing.T, e *env) {
	const n, calls = 5, 30
	msgs := make([]*sdk.Message, n)
	for i := range msgs {
		msgs[i] = textMessage("ctx-done-receive-" + strconv.Itoa(i))
	}
	e.publish(t, msgs...)
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	taken := 0
	for i := range calls {
		ds, err := e.b.Receive(cancelled, e.q, n)
		if len(ds) > 0 {
			taken += len(ds)
			t.Errorf("Receive call %d with a cancelled context returned %d deliveries (err %v)", i+1, len(ds), err)
		} else if err != context.Canceled { // ctx.Err() itself, as sdk.Subscriber says
			t.Errorf("Receive call %d with a cancelled context: %v, want ctx.Err() (context.Canceled)", i+1, err)
		}
		// A broker that fills a buffer in the background (RabbitMQ's
		// prefetch) has time to: the deliveries wait there, ready.
		time.Sleep(10 * time.Millisecond)
	}
	if taken > 0 {
		t.Fatalf("%d deliveries handed to callers whose context was cancelled", taken)
	}
	// Takes nothing: every message is still there, on its first attempt.
	ctx := e.ctx(t)
	got := map[string]bool{}
	e.receiveEach(t, n, func(d sdk.Delivery) { // each acked within its lease
		if !e.attemptIs(d.Attempt(), 1) {
			t.Errorf("message %s: Attempt() = %d after cancelled Receives, want 1", d.Message().ID, d.Attempt())
		}
		got[d.Message().ID] = true
		settleAck(t, ctx, d)
	})
	for _, m := range msgs {
		if !got[m.ID] {
			t.Errorf("message %s not received", m.ID)
		}
	}
}

// oddHeaders are header names and values with slashes, quotes, control
// characters and markup, all valid UTF-8 without NUL.
var oddHeaders = map[string]string{
	"x-path/with/slashes":          `a/b\c//d\\e`,
	`x-"double"-'single'-` + "`b`": `"double" 'single' ` + "`back` \"\\\"",
	"x-ctl\tname\x01":              "tab\there\r\nline\x01\x1b[31mred\x1b[0m\x7f\u0085\u2028",
	"x-json":                       `{"k":"v","n":[1,2]}`,
	"x-markup":                     `<script>alert("x")</script>&amp;%00%s%n`,
	" x-spaces ":                   " leading and trailing ",
	"X-Case":                       "Upper",
	"x-case":                       "lower",
	"x-percent%2F":                 "%2F%25",
}

// oddBodies look like JSON but are not valid UTF-8, or hold bytes that
// text columns and text transports mishandle. A body is any bytes.
var oddBodies = [][]byte{
	[]byte(`{"a":"` + "\xff" + `"}`),                    // invalid UTF-8 inside a JSON string
	[]byte(`["` + "\xc3\x28" + `"]`),                    // a broken two-byte sequence
	[]byte(`"` + "\xed\xa0\x80" + `"`),                  // a UTF-16 surrogate encoded in UTF-8
	[]byte(`{"a":"\u0000"}`),                            // valid JSON with an escaped NUL
	[]byte(`{"a":"` + "\x00" + `"}`),                    // a raw NUL: not JSON
	[]byte("\xef\xbb\xbf{\"bom\":true}"),                // JSON after a byte-order mark
	[]byte("{\"a\":1}\n\r\n"),                           // JSON with trailing line ends
	[]byte(`{"a":"\ud800"}`),                            // valid JSON, an unpaired surrogate escape
	[]byte("\x00\x01\x02\xfe\xff"),                      // binary
	[]byte(" "),                                         // one space
	[]byte("caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x9a\x80"), // valid UTF-8 text
}

func testOddHeadersAndBodies(t *testing.T, e *env) {
	want := make([]*sdk.Message, 0, len(oddBodies))
	for i, body := range oddBodies {
		want = append(want, &sdk.Message{
			ID:             sdk.NewID(),
			Type:           "brokertest.odd/" + strconv.Itoa(i) + `"q"`,
			IdempotencyKey: `op:'a'/b\c "` + strconv.Itoa(i) + `"`,
			Key:            `group/"1"`,
			CorrelationID:  `corr/"x"\` + strconv.Itoa(i),
			Headers:        maps2(oddHeaders),
			Body:           body,
		})
	}
	sent := make([]*sdk.Message, len(want))
	for i, m := range want {
		sent[i] = m.Clone()
	}
	if err := e.b.Publish(e.ctx(t), e.q, sent...); err != nil {
		t.Fatalf("Publish of odd headers and JSON-looking non-UTF-8 bodies: %v", err)
	}
	got := e.checkEach(t, want, nil)
	for _, w := range want {
		if !got[w.ID] {
			t.Errorf("message %s (body %q) not received", w.ID, w.Body)
		}
	}
}

// checkEach receives len(want) deliveries, compares each with the message
// of want with its ID (then calls extra, when not nil, with both) and acks
// it as it comes, within its lease (see receiveEach), and returns the IDs
// received. A delivery of a message not in want is an error.
func (e *env) checkEach(t *testing.T, want []*sdk.Message, extra func(sdk.Delivery, *sdk.Message)) map[string]bool {
	t.Helper()
	ctx := e.ctx(t)
	byID := map[string]*sdk.Message{}
	for _, w := range want {
		byID[w.ID] = w
	}
	got := map[string]bool{}
	e.receiveEach(t, len(want), func(d sdk.Delivery) {
		defer settleAck(t, ctx, d)
		w, ok := byID[d.Message().ID]
		if !ok {
			t.Errorf("unexpected delivery of %s", d.Message().ID)
			return
		}
		got[w.ID] = true
		compareMessage(t, d.Message(), w)
		if extra != nil {
			extra(d, w)
		}
	})
	return got
}

// maps2 returns a copy of m.
func maps2(m map[string]string) map[string]string {
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

func testNULHeader(t *testing.T, e *env) {
	inValue := textMessage("nul-value")
	inValue.Headers = map[string]string{"x-nul": "before\x00after", "x-plain": "v"}
	inName := textMessage("nul-name")
	inName.Headers = map[string]string{"x-nul\x00name": "v"}
	if !e.supports(CapNULHeader) {
		ctx := e.ctx(t)
		for _, bad := range []*sdk.Message{inValue, inName} {
			good := textMessage("beside-nul")
			if err := e.b.Publish(ctx, e.q, good, bad); !errors.Is(err, sdk.ErrInvalidHeader) {
				t.Errorf("Publish with header %q: %v, want ErrInvalidHeader (the broker declares it cannot carry NUL)", bad.Headers, err)
			}
		}
		e.expectNone(t, e.h.Lease/2)
		return
	}
	want := []*sdk.Message{inValue.Clone(), inName.Clone()}
	e.publish(t, inValue, inName)
	want[0].ID, want[1].ID = inValue.ID, inName.ID
	want[0].CorrelationID, want[1].CorrelationID = inValue.CorrelationID, inName.CorrelationID
	got := e.checkEach(t, want, nil)
	for _, w := range want {
		if !got[w.ID] {
			t.Errorf("message %s not received", w.ID)
		}
	}
}

// undeclaredQueue returns a valid queue name that nobody declared, and
// deletes it at the end of the test where the broker can (a broker that
// creates queues on first use leaves one behind otherwise).
func undeclaredQueue(t *testing.T, b sdk.Broker) string {
	q := "brokertest_undeclared_" + randomSuffix()
	if d, ok := b.(interface {
		DeleteQueue(ctx context.Context, queue string) error
	}); ok {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = d.DeleteQueue(ctx, q)
		})
	}
	return q
}

// notFoundWait bounds a Receive on a queue that does not exist: it must end
// with ErrNotFound long before.
func (e *env) notFoundWait() time.Duration { return min(e.h.Timeout, 10*time.Second) }

// checkUndeclared checks what b does with a queue nobody declared.
func (e *env) checkUndeclared(t *testing.T, b sdk.Broker, behaviour Undeclared) {
	t.Helper()
	q := undeclaredQueue(t, b)
	switch behaviour {
	case UndeclaredNotFound:
		if err := b.Publish(e.ctx(t), q, textMessage("undeclared")); !errors.Is(err, sdk.ErrNotFound) {
			t.Errorf("Publish to undeclared queue %s: %v, want ErrNotFound", q, err)
		}
		rctx, cancel := context.WithTimeout(t.Context(), e.notFoundWait())
		defer cancel()
		ds, err := b.Receive(rctx, q, 1)
		if !errors.Is(err, sdk.ErrNotFound) || len(ds) > 0 {
			t.Errorf("Receive from undeclared queue %s: %d deliveries, %v; want ErrNotFound at once", q, len(ds), err)
		}
	case UndeclaredCreated:
		// Receive first: it waits on the new, empty queue.
		if err := expectNoneOn(t.Context(), b, q, e.h.Lease/2); err != nil {
			t.Errorf("Receive from undeclared queue %s: %v", q, err)
		}
		m := textMessage("undeclared")
		if err := b.Publish(e.ctx(t), q, m); err != nil {
			t.Fatalf("Publish to undeclared queue %s: %v (the harness says the broker creates it)", q, err)
		}
		d := e.receiveOn(t, b, q, 1)[0]
		if d.Message().ID != m.ID {
			t.Errorf("got %s from the new queue, want %s", d.Message().ID, m.ID)
		}
		settleAck(t, e.ctx(t), d)
	default:
		t.Fatalf("Harness.Undeclared = %d, unknown", behaviour)
	}
}

func testUndeclaredQueue(t *testing.T, e *env) {
	e.checkUndeclared(t, e.b, e.h.Undeclared)
	if e.h.NewNoDeclare != nil {
		b := e.h.NewNoDeclare(t)
		t.Cleanup(func() { _ = b.Close() })
		e.checkUndeclared(t, b, UndeclaredNotFound)
	}
}

func testDriverErrorAs(t *testing.T, e *env) {
	if e.h.As(sdk.ErrNotFound) || e.h.As(fmt.Errorf("wrapped: %w", errBoom)) {
		t.Fatal("Harness.As matches an error that carries no driver error: it must call errors.As with the driver's type")
	}
	b := e.b
	if e.h.Undeclared != UndeclaredNotFound {
		if e.h.NewNoDeclare == nil {
			t.Fatal("the broker creates queues on first use and has no Harness.NewNoDeclare: nothing gives a driver error; declare CapDriverError unsupported with a reason")
		}
		b = e.h.NewNoDeclare(t)
		t.Cleanup(func() { _ = b.Close() })
	}
	q := undeclaredQueue(t, b)
	rctx, cancel := context.WithTimeout(t.Context(), e.notFoundWait())
	defer cancel()
	_, err := b.Receive(rctx, q, 1)
	if !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("Receive from undeclared queue %s: %v, want ErrNotFound", q, err)
	}
	if !e.h.As(err) {
		t.Errorf("errors.As finds no driver error in %q (%T)", err, err)
	}
}

// peer returns the harness's second instance on e.b's queues.
func (e *env) peer(t *testing.T) sdk.Broker {
	t.Helper()
	p := e.h.Peer(t, e.b)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func testPeersShareWork(t *testing.T, e *env) {
	const n = 20
	instances := []sdk.Broker{e.b, e.peer(t)}
	// Both start receiving before anything is published (RabbitMQ starts
	// its consumer at the first Receive), so that both can take work.
	var wg sync.WaitGroup
	for _, b := range instances {
		wg.Go(func() {
			if err := expectNoneOn(t.Context(), b, e.q, e.h.Lease/4); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	msgs := make([]*sdk.Message, n)
	for i := range msgs {
		msgs[i] = textMessage("shared-" + strconv.Itoa(i))
	}
	e.publish(t, msgs...)
	ctx, cancel := context.WithCancel(e.ctx(t))
	defer cancel()
	var (
		mu      sync.Mutex
		acked   = map[string]int{}
		handled = make([]int, len(instances))
	)
	for i, b := range instances {
		wg.Go(func() {
			for ctx.Err() == nil {
				ds, err := b.Receive(ctx, e.q, 1)
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("instance %d: Receive: %v", i, err)
					}
					return
				}
				for _, d := range ds {
					time.Sleep(20 * time.Millisecond) // the work, so that one instance cannot take it all
					err := d.Ack(ctx)
					mu.Lock()
					switch {
					case err == nil:
						acked[d.Message().ID]++
						handled[i]++
					case errors.Is(err, sdk.ErrLeaseLost):
						t.Logf("instance %d: Ack of %s: %v (it comes back)", i, d.Message().ID, err)
					default:
						t.Errorf("instance %d: Ack of %s: %v", i, d.Message().ID, err)
					}
					if len(acked) == n {
						cancel()
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for _, m := range msgs {
		if c := acked[m.ID]; c != 1 {
			t.Errorf("message %s acked %d times across both instances, want 1", m.ID, c)
		}
	}
	t.Logf("handled per instance: %v", handled)
	for i, h := range handled {
		if h == 0 {
			t.Errorf("instance %d handled none of the %d messages: the work was not shared", i, n)
		}
	}
	if err := expectNoneOn(t.Context(), instances[1], e.q, e.h.Lease+e.h.Lease/2); err != nil {
		t.Error(err)
	}
}

// collect receives from q until it has n deliveries or ctx ends.
func collect(ctx context.Context, b sdk.Broker, q string, n int) ([]sdk.Delivery, error) {
	var all []sdk.Delivery
	for len(all) < n {
		ds, err := b.Receive(ctx, q, n-len(all))
		if err != nil {
			return all, fmt.Errorf("queue %s: Receive after %d of %d deliveries: %w", q, len(all), n, err)
		}
		all = append(all, ds...)
	}
	return all, nil
}

func testManyQueuesSameID(t *testing.T, e *env) {
	const k = 4
	queues := []string{e.q}
	for len(queues) < k {
		queues = append(queues, e.queue(t, e.b))
	}
	shared := sdk.NewID()
	ctx := e.ctx(t)
	errs := make(chan error, 2*k)
	var wg sync.WaitGroup
	own := make([]string, k)
	for i, q := range queues {
		wg.Go(func() {
			same := &sdk.Message{ID: shared, Type: "brokertest.same-id", Headers: map[string]string{"x-queue": q}, Body: []byte(q)}
			other := &sdk.Message{Type: "brokertest.own", Body: []byte("own " + q)}
			if err := e.b.Publish(ctx, q, same, other); err != nil {
				errs <- fmt.Errorf("Publish to %s: %w", q, err)
			}
			own[i] = other.ID
		})
	}
	wg.Wait()
	for i, q := range queues {
		wg.Go(func() {
			ds, err := collect(ctx, e.b, q, 2)
			if err != nil {
				errs <- err
			}
			for _, d := range ds {
				m := d.Message()
				switch {
				case d.Queue() != q:
					errs <- fmt.Errorf("delivery from %s says Queue() = %s", q, d.Queue())
				case m.ID == shared && (string(m.Body) != q || m.Header("x-queue") != q):
					errs <- fmt.Errorf("message %s received from %s carries the body and header of queue %q / %q: leaked between queues", m.ID, q, m.Body, m.Header("x-queue"))
				case m.ID != shared && m.ID != own[i]:
					errs <- fmt.Errorf("message %s (%q) received from %s, published elsewhere", m.ID, m.Body, q)
				}
				if err := d.Ack(ctx); err != nil {
					errs <- fmt.Errorf("Ack of %s on %s: %w", m.ID, q, err)
				}
			}
			// Acking one queue's copy of the shared ID touched no other.
			if err := expectNoneOn(ctx, e.b, q, e.h.Lease/2); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func testOrderWithinKey(t *testing.T, e *env) {
	q := e.q
	if e.h.OrderedQueue != nil {
		q = e.h.OrderedQueue(t, e.b)
	}
	const keys, perKey = 3, 6
	var msgs []*sdk.Message
	for i := range perKey {
		for k := range keys {
			m := textMessage("ordered")
			m.Key = "key-" + strconv.Itoa(k)
			m.SetHeader("x-seq", strconv.Itoa(i))
			msgs = append(msgs, m)
		}
	}
	if err := e.b.Publish(e.ctx(t), q, msgs...); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	ctx := e.ctx(t)
	next := map[string]int{}
	got := 0
	for got < len(msgs) {
		for _, d := range e.receiveOn(t, e.b, q, 10) {
			m := d.Message()
			seq, _ := strconv.Atoi(m.Header("x-seq"))
			if seq != next[m.Key] {
				t.Errorf("key %s: got message %d (attempt %d), want %d: out of order", m.Key, seq, d.Attempt(), next[m.Key])
			}
			next[m.Key] = seq + 1
			got++
			settleAck(t, ctx, d)
		}
	}
	if err := expectNoneOn(t.Context(), e.b, q, e.h.Lease/2); err != nil {
		t.Error(err)
	}
}

// closeConcurrently closes b from several goroutines at once and checks
// that every Close returns nil.
func closeConcurrently(t *testing.T, b sdk.Broker) {
	t.Helper()
	const closers = 4
	errs := make(chan error, closers)
	for range closers {
		go func() { errs <- b.Close() }()
	}
	for range closers {
		if err := <-errs; err != nil {
			t.Errorf("concurrent Close: %v, want nil", err)
		}
	}
}

func testConcurrentCloseWhileBusy(t *testing.T, e *env) {
	e.publish(t, textMessage("busy-1"), textMessage("busy-2"))
	held := e.receiveN(t, 2)
	waiting := make(chan error, 1)
	go func() {
		for {
			ds, err := e.b.Receive(t.Context(), e.q, 1)
			if err != nil || len(ds) > 0 {
				if len(ds) > 0 {
					err = fmt.Errorf("Receive on a queue whose messages are all held returned %s", ds[0].Message().ID)
				}
				waiting <- err
				return
			}
		}
	}()
	time.Sleep(50 * time.Millisecond)
	closeConcurrently(t, e.b)
	select {
	case err := <-waiting:
		if !errors.Is(err, sdk.ErrClosed) {
			t.Errorf("Receive waiting across Close: %v, want ErrClosed", err)
		}
	case <-time.After(e.h.Timeout):
		t.Fatalf("Receive waiting across Close did not return within %s", e.h.Timeout)
	}
	if err := e.b.Close(); err != nil {
		t.Errorf("Close after the concurrent ones: %v, want nil", err)
	}
	_ = held // held unsettled through Close: CloseReturnsUnsettled checks they come back
}

func testCloseReturnsUnsettled(t *testing.T, e *env) {
	peer := e.peer(t)
	msgs := []*sdk.Message{textMessage("unsettled-1"), textMessage("unsettled-2"), textMessage("unsettled-3")}
	e.publish(t, msgs...)
	held := map[string]int{}                     // the Attempt() of each delivery held through Close
	for _, d := range e.receiveN(t, len(msgs)) { // held through Close by design
		held[d.Message().ID] = d.Attempt()
		if !e.attemptIs(d.Attempt(), 1) {
			t.Errorf("message %s: first Attempt() = %d", d.Message().ID, d.Attempt())
		}
	}
	closeConcurrently(t, e.b)
	ctx := e.ctx(t)
	back := map[string]bool{}
	e.receiveEachOn(t, peer, e.q, len(msgs), func(d sdk.Delivery) { // each acked within its lease
		// 2, and above the attempt held at Close (with LostReceives a lost
		// answer may have taken one more, before Close or after).
		if a := d.Attempt(); !e.attemptIs(a, 2) || a <= held[d.Message().ID] {
			t.Errorf("message %s back on the other instance with Attempt() = %d (held at Close with %d), want 2", d.Message().ID, a, held[d.Message().ID])
		}
		back[d.Message().ID] = true
		settleAck(t, ctx, d)
	})
	for _, m := range msgs {
		if !back[m.ID] {
			t.Errorf("message %s held at Close did not come back", m.ID)
		}
	}
	if err := expectNoneOn(t.Context(), peer, e.q, e.h.Lease+e.h.Lease/2); err != nil {
		t.Error(err)
	}
}

func testPublishRacingClose(t *testing.T, e *env) {
	var peer sdk.Broker
	if e.supports(CapPeer) {
		peer = e.peer(t)
	}
	const publishers, most, closeAfter = 4, 25, 8
	ctx := e.ctx(t)
	var (
		mu        sync.Mutex
		sent      = map[string]bool{}
		refused   = map[string]error{}
		enough    = make(chan struct{})
		closeOnce sync.Once
		wg        sync.WaitGroup
	)
	for p := range publishers {
		wg.Go(func() {
			for i := range most {
				m := textMessage("racing-" + strconv.Itoa(p) + "-" + strconv.Itoa(i))
				m.ID = sdk.NewID()
				err := e.b.Publish(ctx, e.q, m)
				mu.Lock()
				if err == nil {
					sent[m.ID] = true
					if len(sent) == closeAfter {
						closeOnce.Do(func() { close(enough) })
					}
				} else {
					refused[m.ID] = err
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	select {
	case <-enough:
	case <-ctx.Done():
		t.Fatalf("%d publishes did not succeed within %s", closeAfter, e.h.Timeout)
	}
	closeConcurrently(t, e.b)
	wg.Wait()
	t.Logf("%d publishes reported sent, %d refused", len(sent), len(refused))
	for id, err := range refused {
		if !errors.Is(err, sdk.ErrClosed) {
			t.Errorf("Publish of %s racing Close: %v, want nil or ErrClosed", id, err)
		}
	}
	if peer == nil {
		t.Logf("not checked that the %d messages reported sent arrive: the broker has no second instance (%s)", len(sent), e.h.Unsupported[CapPeer])
		return
	}
	// Every message reported sent arrives; a refused one may too (its
	// confirm was lost to Close), which at-least-once allows.
	missing := map[string]bool{}
	for id := range sent {
		missing[id] = true
	}
	for len(missing) > 0 {
		ds, err := peer.Receive(ctx, e.q, 10)
		if err != nil {
			t.Fatalf("%d messages reported sent never arrived (%v), e.g. %v", len(missing), err, first(missing))
		}
		for _, d := range ds {
			delete(missing, d.Message().ID)
			settleAck(t, ctx, d)
		}
	}
}

// first returns some key of m.
func first(m map[string]bool) string {
	for k := range m {
		return k
	}
	return ""
}

func testSettleAfterClose(t *testing.T, e *env) {
	var peer sdk.Broker
	if e.supports(CapPeer) {
		peer = e.peer(t)
	}
	msgs := []*sdk.Message{textMessage("after-close-ack"), textMessage("after-close-retry"), textMessage("after-close-dead")}
	e.publish(t, msgs...)
	byType := map[string]sdk.Delivery{}
	for _, d := range e.receiveN(t, len(msgs)) {
		byType[d.Message().Type] = d
	}
	if err := e.b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	ctx := e.ctx(t)
	d := byType["brokertest.after-close-ack"]
	if err := d.Ack(ctx); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("Ack after Close: %v, want ErrClosed", err)
	}
	if err := d.ExtendLease(ctx, e.h.Lease); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("ExtendLease after Close: %v, want ErrClosed", err)
	}
	if r, ok := d.(sdk.Releaser); ok {
		if err := r.Release(ctx, 0); !errors.Is(err, sdk.ErrClosed) {
			t.Errorf("Release after Close: %v, want ErrClosed", err)
		}
	}
	if err := byType["brokertest.after-close-retry"].Retry(ctx, 0, errBoom); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("Retry after Close: %v, want ErrClosed", err)
	}
	if err := byType["brokertest.after-close-dead"].DeadLetter(ctx, sdk.Permanent(errBoom)); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("DeadLetter after Close: %v, want ErrClosed", err)
	}
	if peer == nil {
		t.Logf("not checked that the messages come back: the broker has no second instance (%s)", e.h.Unsupported[CapPeer])
		return
	}
	// Nothing lost, nothing settled: all three come back, none dead.
	back := map[string]bool{}
	e.receiveEachOn(t, peer, e.q, len(msgs), func(d sdk.Delivery) { // each acked within its lease
		back[d.Message().Type] = true
		if !e.attemptIs(d.Attempt(), 2) {
			t.Errorf("%s back with Attempt() = %d, want 2", d.Message().Type, d.Attempt())
		}
		settleAck(t, ctx, d)
	})
	for _, m := range msgs {
		if !back[m.Type] {
			t.Errorf("%s settled after Close did not come back", m.Type)
		}
	}
	if dl, ok := peer.(sdk.DeadLetters); ok && e.supports(CapDeadLetters) {
		if ms, err := dl.ListDeadLetters(ctx, e.q, 10); err != nil || len(ms) != 0 {
			t.Errorf("ListDeadLetters after a DeadLetter refused by Close: %d, %v; want none", len(ms), err)
		}
	}
}

func testConnectionLoss(t *testing.T, e *env) {
	b, cut := e.h.Faulty(t)
	t.Cleanup(func() { _ = b.Close() })
	q := e.queue(t, b)
	const n = 20
	ctx := e.ctx(t)
	publish := func(msgs []*sdk.Message) {
		t.Helper()
		for {
			err := b.Publish(ctx, q, msgs...)
			if err == nil {
				return
			}
			if !errors.Is(err, sdk.ErrUnavailable) || ctx.Err() != nil {
				t.Fatalf("Publish around a connection loss: %v, want nil or ErrUnavailable until it is back", err)
			}
			t.Logf("Publish: %v (retried)", err)
			time.Sleep(50 * time.Millisecond)
		}
	}
	msgs := make([]*sdk.Message, n)
	for i := range msgs {
		msgs[i] = textMessage("cut-" + strconv.Itoa(i))
		msgs[i].ID = sdk.NewID()
	}
	publish(msgs[:n/2])
	acked := map[string]int{}
	wasCut := false
	for len(acked) < n {
		ds, err := b.Receive(ctx, q, 5)
		if err != nil {
			if errors.Is(err, sdk.ErrUnavailable) && ctx.Err() == nil {
				t.Logf("Receive: %v (retried)", err)
				time.Sleep(50 * time.Millisecond)
				continue
			}
			t.Fatalf("Receive after %d of %d acked (cut: %v): %v", len(acked), n, wasCut, err)
		}
		for _, d := range ds {
			if !wasCut && len(acked) >= 3 {
				// d and the rest of its batch were received before
				// the cut and are settled after it.
				cut()
				wasCut = true
				publish(msgs[n/2:])
			}
			err := d.Ack(ctx)
			switch {
			case err == nil:
				acked[d.Message().ID]++
			case errors.Is(err, sdk.ErrLeaseLost) || errors.Is(err, sdk.ErrUnavailable):
				t.Logf("Ack of %s across the cut: %v (it comes back)", d.Message().ID, err)
			default:
				t.Errorf("Ack of %s across the cut: %v, want nil, ErrLeaseLost or ErrUnavailable", d.Message().ID, err)
			}
		}
	}
	for _, m := range msgs {
		if acked[m.ID] == 0 {
			t.Errorf("message %s never acked", m.ID)
		}
	}
	if err := expectNoneOn(t.Context(), b, q, e.h.Lease+e.h.Lease/2); err != nil {
		t.Error(err)
	}
}
