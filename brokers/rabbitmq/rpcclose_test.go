package rabbitmq

import (
	"context"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestChannelCloseWaitsForCall: closing a consumer channel is a
// synchronous call (channel.close, answered by close-ok) like the
// basic.qos of a SyncAck's round trip, and amqp091 hands a reply to
// whichever call waiting on the channel reads it first: a close in
// flight with a basic.qos could take the qos-ok (the Ack then fails,
// ErrLeaseLost, although the server processed it) or, sent first, leave
// the basic.qos to the server's closing channel, which drops it, and the
// close-ok to the Qos: the close then waits for a reply that never comes,
// the consumer stalled until the connection dies. So the channel is
// closed under rpcMu, as every other call on it. Holding rpcMu here stands
// for such a call in flight while the server cancels the consumer (its
// queue deleted), which makes the session close the channel: it must wait.
func TestChannelCloseWaitsForCall(t *testing.T) {
	url, q, b := brokerOnQueue(t, Options{Logger: quiet, SyncAck: true})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := b.Publish(ctx, q, &sdk.Message{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil {
		t.Fatal(err)
	}
	st := ds[0].(*delivery).st

	st.rpcMu.Lock() // a synchronous call in flight
	deleteOne(t, url, q)
	// The session sees the cancel at once and, were the close not
	// serialised, closes the channel within milliseconds.
	for i := 0; i < 50; i++ {
		if st.ch.IsClosed() {
			st.rpcMu.Unlock()
			t.Fatal("the consumer channel was closed while a synchronous call was in flight on it")
		}
		time.Sleep(20 * time.Millisecond)
	}
	st.rpcMu.Unlock()
	for !st.ch.IsClosed() {
		if ctx.Err() != nil {
			t.Fatal("the consumer channel was not closed once the call in flight ended")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
