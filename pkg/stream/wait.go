package stream

import (
	"sync"
	"time"
)

// Waiting. Python waits in slices (Stream.Wait(50 ms) in a loop, the GIL released), so Ctrl-C lands
// between them. Within a slice:
//
//  1. spin on the query for up to spinFor: most waits are short (a copy of tens of MiB takes well under
//     a millisecond), each query is one driver call of about a microsecond, and the GIL is released
//     meanwhile. The driver's own synchronize spins the same way before it yields;
//  2. then block in the driver (cuStreamSynchronize / cuEventSynchronize) on a helper goroutine, and
//     wait for it with the slice's timeout. The driver's own wait wakes us once, when the work is done,
//     but the hand-over from the helper costs tens of microseconds, which is why it comes only after the
//     spin; sleeping and polling instead cost about 100 µs per sleep on a cgo callback's thread.
//
// A blocking call that outlives its slice keeps running; the next slice picks it up. Since it covers only
// the work queued before it started, its return is confirmed with a query before a wait reports done.
const spinFor = 2 * time.Millisecond

// pendingWait is one blocking driver wait running on a helper goroutine.
type pendingWait struct {
	done chan struct{} // closed when block has returned
	err  error         // block's result, written before done is closed
}

// blocker runs at most one blocking driver wait at a time for one stream or event.
type blocker struct {
	mu  sync.Mutex
	cur *pendingWait
}

// wait waits at most timeout for the blocking call in flight (starting one with block if none is) and
// says whether it returned, with its error.
func (b *blocker) wait(timeout time.Duration, block func() error) (bool, error) {
	b.mu.Lock()
	f := b.cur
	if f == nil {
		f = &pendingWait{done: make(chan struct{})}
		b.cur = f
		go func() {
			f.err = block()
			close(f.done)
		}()
	}
	b.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-f.done:
		b.mu.Lock()
		if b.cur == f {
			b.cur = nil
		}
		b.mu.Unlock()
		return true, f.err
	case <-t.C:
		return false, nil
	}
}

// waitFor implements Stream.Wait and Event.Wait: query until done, spinning first and then blocking in
// the driver through b, for at most timeout.
func waitFor(timeout time.Duration, query func() (bool, error), b *blocker, block func() error) (bool, error) {
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		done, err := query()
		if done || err != nil {
			return done, err
		}
		now := time.Now()
		if !now.Before(deadline) {
			return false, nil
		}
		if now.Sub(start) < spinFor {
			continue
		}
		returned, err := b.wait(deadline.Sub(now), block)
		if err != nil {
			return false, err
		}
		if !returned {
			return false, nil
		}
		// It returned: confirm with the query at the top of the loop (it may have been an earlier
		// slice's call, from before newer work was queued).
	}
}
