package sqs

import (
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestSenderPoolReusesAndStops: run calls its function on a pool goroutine
// (not the caller's) and returns after it; calls one after another reuse one
// goroutine; concurrent calls get one each; close stops them all (Wait
// returns) and later calls run on the caller.
func TestSenderPoolReusesAndStops(t *testing.T) {
	var p senderPool
	me := goid()
	ran := map[uint64]int{}
	for range 5 {
		p.run(func() { ran[goid()]++ })
	}
	if ran[me] != 0 {
		t.Fatal("run called its function on the calling goroutine")
	}
	if len(ran) != 1 {
		t.Fatalf("calls one after another ran on %d goroutines, want 1 reused: %v", len(ran), ran)
	}
	if n := idle(&p); n != 1 {
		t.Fatalf("%d idle senders, want 1", n)
	}

	// Four at once: each needs a goroutine of its own.
	const k = 4
	var started sync.WaitGroup
	started.Add(k)
	release := make(chan struct{})
	var wg sync.WaitGroup
	var busy atomic.Int32
	for range k {
		wg.Go(func() {
			p.run(func() {
				busy.Add(1)
				started.Done()
				<-release
			})
		})
	}
	started.Wait()
	if got := busy.Load(); got != k {
		t.Fatalf("%d calls running together, want %d", got, k)
	}
	close(release)
	wg.Wait()
	if n := idle(&p); n != k {
		t.Fatalf("%d idle senders, want %d", n, k)
	}

	p.close()
	if n := idle(&p); n != 0 {
		t.Fatalf("%d idle senders after close", n)
	}
	var after bool
	p.run(func() { after = true })
	if !after {
		t.Fatal("run after close did not call its function")
	}
}

// TestSenderPoolCloseWaitsForBusySender: a sender busy at close finishes
// its call (the caller gets its result), then stops; close waits for it.
func TestSenderPoolCloseWaitsForBusySender(t *testing.T) {
	var p senderPool
	p.run(func() {}) // one idle sender
	inCall := make(chan struct{})
	finish := make(chan struct{})
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		p.run(func() {
			close(inCall)
			<-finish
		})
	}()
	<-inCall
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		p.close()
	}()
	select {
	case <-closed:
		t.Fatal("close returned while a sender was in its call")
	case <-returned:
		t.Fatal("run returned before its function did")
	default:
	}
	close(finish)
	<-returned
	<-closed
}

// TestSenderPoolPanicAndGoexit: a panic in a call is raised again in run's
// caller and the sender stays in the pool; a call that exits its goroutine
// (runtime.Goexit) exits run's caller too, rather than leaving it waiting
// for ever, and its sender is gone. close then stops the rest.
func TestSenderPoolPanicAndGoexit(t *testing.T) {
	var p senderPool
	got := func() (v any) {
		defer func() { v = recover() }()
		p.run(func() { panic("boom") })
		return nil
	}()
	if got != "boom" {
		t.Fatalf("recovered %v from run, want the call's panic \"boom\"", got)
	}
	if n := idle(&p); n != 1 {
		t.Fatalf("%d idle senders after a call panicked, want 1", n)
	}

	exited := make(chan bool, 1)
	go func() {
		returned := false
		defer func() { exited <- !returned }()
		p.run(runtime.Goexit)
		returned = true
	}()
	select {
	case ok := <-exited:
		if !ok {
			t.Fatal("run returned after its call ran runtime.Goexit")
		}
	case <-time.After(10 * time.Second): // a signal that never comes: no timing asserted
		t.Fatal("run still waits for a call that ran runtime.Goexit")
	}
	if n := idle(&p); n != 0 {
		t.Fatalf("%d idle senders after the sender's goroutine exited, want 0", n)
	}
	var ran bool
	p.run(func() { ran = true })
	if !ran {
		t.Fatal("run after a Goexit did not call its function")
	}
	p.close()
}

// idle is how many senders wait for work.
func idle(p *senderPool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

// goid is the calling goroutine's ID, from the first line of its stack
// trace ("goroutine 7 [running]:").
func goid() uint64 {
	var buf [64]byte
	n := runtime.Stack(buf[:], false)
	f := strings.Fields(string(buf[:n]))
	id, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		panic("goid: " + err.Error())
	}
	return id
}

// TestPanicNilIsAPanicUnderPanicNil: with GODEBUG=panicnil=1, panic(nil)
// is recovered as nil, as a runtime.Goexit is. A call's panic(nil) is still
// raised in run's caller (and in a multi-chunk Publish's, through guard) as
// a panic it can recover, not as a runtime.Goexit, which the old code made
// of it (it told the two apart by recover's value), ending the caller's
// goroutine where a recover could not stop it.
func TestPanicNilIsAPanicUnderPanicNil(t *testing.T) {
	t.Setenv("GODEBUG", "panicnil=1")
	type outcome struct{ returned, recovered bool }
	catch := func(f func()) outcome {
		got := make(chan outcome, 1)
		go func() {
			var o outcome
			defer func() { got <- o }()
			func() {
				defer func() { _ = recover() }()
				f()
				o.returned = true
			}()
			o.recovered = !o.returned
		}()
		return <-got
	}
	var p senderPool
	defer p.close()
	if o := catch(func() { p.run(func() { panic(nil) }) }); !o.recovered {
		t.Fatalf("run of a call that panicked with nil: %+v, want a panic its caller recovers", o)
	}
	if o := catch(func() { p.run(runtime.Goexit) }); o.returned || o.recovered {
		t.Fatalf("run of a call that exited: %+v, want its caller exited", o)
	}
	if o := catch(func() {
		var a abend
		guard(&a, func() { panic(nil) })
		a.raise()
	}); !o.recovered {
		t.Fatalf("guard and raise of panic(nil): %+v, want a panic its caller recovers", o)
	}
}
