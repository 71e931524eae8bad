package sqs

import (
	"runtime"
	"sync"
)

// senderPool runs the coalescer's SendMessageBatch calls on goroutines of
// its own, kept while the broker is open, instead of on the publishing
// goroutine that found a sender free.
//
// The SDK's middleware stack is deep: one call grows a goroutine's stack to
// tens of KiB. With many goroutines publishing a message each, the one that
// sends changes from call to call, and between its turns the garbage
// collector shrinks its idle stack (to a quarter of what it used is the
// rule), so nearly every call grew a stack again, copying it several times:
// runtime.copystack and newstack were 7 % of the client's CPU with 64
// callers, and nothing for a raw loop whose eight goroutines always send. A
// sender goroutine is mostly inside a call when the collector looks, and
// the idle ones are reused last-in first-out, so the ones in use keep
// their grown stacks. The cost is a hand-off to the sender and back, per
// call rather than per message.
//
// There are at most as many senders as calls in flight ([Options.PublishSenders]):
// run is called only by a holder of one of the coalescer's tokens.
//
// A panic in a call (a client middleware's, say) is raised again in run's
// caller, the Publish that sent it, as when the call ran on that goroutine:
// there it can be recovered (the Worker recovers a handler's), where on a
// sender it would end the process. The sender recovers and stays in the
// pool; one whose call ran runtime.Goexit ends, and run's caller exits too.
type senderPool struct {
	mu     sync.Mutex
	idle   []*sender // last in, first out
	closed bool
	wg     sync.WaitGroup // the sender goroutines
}

// sender is one goroutine of the pool and its work, one call at a time.
type sender struct {
	work chan *call // holds one: run never waits to hand over
}

// call is a function to run and the channel closed once it has returned
// (or panicked) and its sender is idle again (or stopped).
type call struct {
	f     func()
	done  chan struct{}
	abend // how f ended when it did not return, set before done is closed
}

// abend is how a function run for a caller on another goroutine ended when
// it did not return: panicked with the value p (recover's: a
// *runtime.PanicNilError for panic(nil)), or exited (runtime.Goexit). The
// zero value: it returned.
type abend struct {
	panicked, exited bool
	p                any
}

// guard calls f and, when f does not return, records in *a how it ended:
// the goroutine then goes on after guard when f panicked (the panic is
// recovered), and ends, with *a set before guard's caller's deferred calls
// run, when f exited. A panic is told from an exit by whether recover
// stopped it, not by its value: recover returns nil for a runtime.Goexit,
// and also for panic(nil) under GODEBUG=panicnil=1.
func guard(a *abend, f func()) {
	returned, recovered := false, false
	defer func() {
		if !returned && !recovered {
			*a = abend{exited: true} // runtime.Goexit: recover stops nothing
		}
	}()
	func() {
		defer func() {
			if !returned {
				*a = abend{panicked: true, p: recover()}
			}
		}()
		f()
		returned = true
	}()
	recovered = !returned // reached only when f returned or its panic was recovered
}

// raise ends the calling goroutine as the function did: with its panic, or
// runtime.Goexit. It returns when the function returned.
func (a abend) raise() {
	switch {
	case a.exited:
		runtime.Goexit()
	case a.panicked:
		panic(a.p)
	}
}

// run calls f on a sender goroutine and returns when it has returned. After
// close it calls f itself.
func (p *senderPool) run(f func()) {
	c := p.start(f)
	<-c.done
	c.raise()
}

// start hands f to a sender goroutine and returns its call: done is closed
// once f has ended, and the call's abend says how. After close it calls f
// itself (a runtime.Goexit of f then ends the caller), and returns the call
// ended. The caller may stop waiting for done: the sender goes on.
func (p *senderPool) start(f func()) *call {
	c := &call{f: f, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		guard(&c.abend, f)
		close(c.done)
		return c
	}
	var s *sender
	if n := len(p.idle); n > 0 {
		s = p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
	} else {
		s = &sender{work: make(chan *call, 1)}
		p.wg.Add(1)
		go p.loop(s)
	}
	p.mu.Unlock()
	s.work <- c
	return c
}

// loop runs s's work until close finds s idle (or a call exits the
// goroutine).
func (p *senderPool) loop(s *sender) {
	defer p.wg.Done()
	for c := range s.work {
		if !p.serve(s, c) {
			return
		}
	}
}

// serve runs c.f and reports whether s goes on: not once the pool is
// closed, nor when f exited the goroutine (its deferred calls then end it).
func (p *senderPool) serve(s *sender, c *call) (more bool) {
	defer func() {
		// Idle again before the caller goes on: its next call finds s.
		p.mu.Lock()
		more = !p.closed && !c.exited
		if more {
			p.idle = append(p.idle, s)
		}
		p.mu.Unlock()
		close(c.done)
	}()
	guard(&c.abend, c.f)
	return
}

// close stops the senders: the idle ones at once, a busy one when its call
// returns (the broker's closing ends it). It waits for them. Later runs call
// their function themselves.
func (p *senderPool) close() {
	p.mu.Lock()
	p.closed = true
	for _, s := range p.idle {
		close(s.work) // idle: not handed out, so nothing sends on it any more
	}
	p.idle = nil
	p.mu.Unlock()
	p.wg.Wait()
}
