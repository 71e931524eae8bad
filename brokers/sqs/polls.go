package sqs

import (
	"context"
	"sync"
	"time"
)

// pollMargin is how much later than its attempt started SQS may begin an
// attempt's long poll: the request's way to the server, which a loaded
// client or server can stretch. An abandoned poll waits on the server until
// at most its attempt's start + WaitTimeSeconds + pollMargin.
const pollMargin = time.Second

// polls tracks the long polls of one queue that this Broker gave up on
// (their ctx ended, Close cut them, or an attempt's answer was lost) while
// the server may still be waiting on them. The server does not notice that
// the caller has gone: such a poll takes the next message that becomes
// visible, counts a receive nobody sees (ApproximateReceiveCount, which
// MaxReceiveCount bounds) and hides the message for the visibility timeout.
// A message this Broker makes visible itself would be the first taken: a
// draining Worker cuts its idle polls, then hands back the deliveries its
// interrupted handlers leave (Retry with no delay). hold says how long such
// a hand-back must keep the message hidden for it to come back only after
// those polls have ended.
type polls struct {
	mu    sync.Mutex
	live  map[*attempts]livePoll // the calls under way
	until int64                  // Unix nanoseconds: the latest end of a poll given up that returned
}

// livePoll is a ReceiveMessage call under way: the context it runs under
// and its long-poll wait, in the whole seconds SQS waits.
type livePoll struct {
	ctx  context.Context
	wait time.Duration
}

// begin registers a ReceiveMessage call under ctx that long-polls for wait
// and whose attempts seen notes (watchAttempts); end must follow. A call
// that does not long-poll (wait 0) leaves nothing waiting on the server and
// is not registered.
func (p *polls) begin(ctx context.Context, seen *attempts, wait time.Duration) {
	wait = time.Duration(ceilSeconds(wait)) * time.Second
	if wait <= 0 {
		return
	}
	seen.started.CompareAndSwap(0, time.Now().UnixNano())
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.live == nil {
		p.live = make(map[*attempts]livePoll)
	}
	p.live[seen] = livePoll{ctx: ctx, wait: wait}
}

// end unregisters the call begin registered with seen. A call given up (an
// attempt of it ended without SQS's answer: see [lostAttempt]) may still
// wait on the server: hold counts it until its end.
func (p *polls) end(seen *attempts, givenUp bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	lp, ok := p.live[seen]
	if !ok {
		return
	}
	delete(p.live, seen)
	if givenUp || seen.lost.Load() != nil {
		p.until = max(p.until, lp.end(seen))
	}
}

// end is the latest the server may keep waiting on the call's polls: its
// latest attempt's start, plus the wait and pollMargin.
func (lp livePoll) end(seen *attempts) int64 {
	return seen.started.Load() + int64(lp.wait+pollMargin)
}

// hold returns how long after now a poll of the queue that this Broker gave
// up on may still wait on the server, 0 when none may. It counts the calls
// that returned given up and those under way whose ctx has ended (the SDK
// has yet to notice) or whose earlier attempt's answer was lost.
func (p *polls) hold(now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	until := p.until
	for seen, lp := range p.live {
		if lp.ctx.Err() != nil || seen.lost.Load() != nil {
			until = max(until, lp.end(seen))
		}
	}
	return max(time.Duration(until-now.UnixNano()), 0)
}
