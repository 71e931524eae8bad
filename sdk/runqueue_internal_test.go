package sdk

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestRunQueueLosesNoWakeUp pushes tasks from several goroutines, a slot
// at a time as the Worker's receive loops do, to takers that sometimes
// yield or sleep, and checks that every task is taken exactly once and that
// no task is left in the queue while every taker waits (a lost wake-up:
// the pushers then stop, since no slot comes back).
func TestRunQueueLosesNoWakeUp(t *testing.T) {
	for _, c := range []struct{ capacity, takers, pushers int }{{1, 1, 1}, {2, 2, 1}, {2, 1, 2}, {8, 6, 3}} {
		t.Run(fmt.Sprintf("capacity%d-takers%d-pushers%d", c.capacity, c.takers, c.pushers), func(t *testing.T) {
			testRunQueue(t, c.capacity, c.takers, c.pushers, 20000)
		})
	}
}

func testRunQueue(t *testing.T, capacity, takers, pushers, perPusher int) {
	rq := newRunQueue(capacity)
	free := make(chan int, capacity)
	for i := range capacity {
		free <- i
	}
	seen := make([]atomic.Int32, pushers*perPusher)
	var taken atomic.Int64
	var wg sync.WaitGroup
	for i := range takers {
		wg.Go(func() {
			k := taker{r: rq}
			rnd := rand.New(rand.NewPCG(uint64(i), 1))
			for {
				tk, ok := k.next()
				if !ok {
					return
				}
				seen[tk.received].Add(1)
				taken.Add(1)
				switch rnd.IntN(50) {
				case 0:
					time.Sleep(time.Duration(rnd.IntN(50)) * time.Microsecond)
				case 1, 2, 3:
					runtime.Gosched()
				}
				free <- int(tk.slot)
			}
		})
	}
	var pw sync.WaitGroup
	for p := range pushers {
		pw.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(p), 2))
			for n := 0; n < perPusher; {
				batch := 1 + rnd.IntN(capacity)
				var slot int
				select {
				case slot = <-free:
				case <-time.After(10 * time.Second):
					t.Errorf("pusher %d: no slot came back in 10s after %d tasks: a wake-up was lost (%d in the queue)", p, n, len(rq.jobs))
					return
				}
				rq.push(&task{slot: int32(slot), received: int64(p*perPusher + n)})
				n++
				for ; batch > 1 && n < perPusher; batch-- {
					select {
					case slot = <-free:
					default:
						batch = 0
						continue
					}
					rq.push(&task{slot: int32(slot), received: int64(p*perPusher + n)})
					n++
				}
				rq.wakeOne()
			}
		})
	}
	pw.Wait()
	rq.close()
	wg.Wait()
	if got := taken.Load(); got != int64(pushers*perPusher) {
		t.Fatalf("taken %d tasks, want %d", got, pushers*perPusher)
	}
	for i := range seen {
		if n := seen[i].Load(); n != 1 {
			t.Fatalf("task %d taken %d times", i, n)
		}
	}
}
