package stream

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// Event is a CUDA event of a Manager's device.
type Event struct {
	m         *Manager
	h         cuda.Event
	timing    bool
	destroyed atomic.Bool
	// interprocess: made with CU_EVENT_INTERPROCESS, or opened from another process (multi.go)
	interprocess bool

	waiter blocker      // the blocking synchronize of a Wait, if one is in flight (wait.go)
	use    sync.RWMutex // as Stream.use: waiting driver calls on h against Destroy

	mu       sync.Mutex
	captured bool     // last recorded inside a capture: host waits on it fail with 907 until recorded outside one
	in       *capture // that capture; a stream waiting on the event while it is in progress joins it
	recorded bool     // last recorded outside a capture
}

// NewEvent creates an event; timing events can measure ElapsedTime, others are cheaper to record.
func (m *Manager) NewEvent(timing bool) (*Event, error) {
	flags := cuda.EventDefault
	if !timing {
		flags = cuda.EventDisableTiming
	}
	h, err := m.drv.EventCreate(m.ctx, flags)
	if err != nil {
		return nil, err
	}
	return &Event{m: m, h: h, timing: timing}, nil
}

// Handle returns the driver's handle.
func (e *Event) Handle() cuda.Event { return e.h }

// Timing says whether the event can measure elapsed time.
func (e *Event) Timing() bool { return e.timing }

func (e *Event) String() string {
	return fmt.Sprintf("event %#x of device %d", uint64(e.h), e.m.dev.Ordinal())
}

func (e *Event) alive(op string) error {
	if e.destroyed.Load() {
		return cuda.NewError("cudacore."+op, cuda.ErrorClosed, fmt.Sprintf("%s was destroyed", e))
	}
	return nil
}

// hold runs call, a driver call on e's handle, while e cannot be destroyed (see Stream.hold).
func (e *Event) hold(op string, call func() error) error {
	e.use.RLock()
	defer e.use.RUnlock()
	if err := e.alive(op); err != nil {
		return err
	}
	return call()
}

// Destroy destroys the event; it is idempotent.
func (e *Event) Destroy() error {
	if !e.destroyed.CompareAndSwap(false, true) {
		return nil
	}
	e.use.Lock() // a Wait's cuEventSynchronize, a query or synchronize of another thread run inside hold
	defer e.use.Unlock()
	return e.m.drv.EventDestroy(e.m.ctx, e.h)
}

// Record records the event on s (nil: the legacy stream). Recorded inside a capture it becomes a node of
// the graph; other streams of the capture may wait on it, but the host cannot until it is recorded again
// outside a capture.
func (e *Event) Record(s *Stream) error {
	const op = "event_record"
	if err := e.alive(op); err != nil {
		return err
	}
	if s == nil {
		s = e.m.legacy
	}
	if err := s.alive(op); err != nil {
		return err
	}
	if err := e.m.sameDevice(op, s.m); err != nil {
		return err
	}
	if err := e.m.checkEnqueue(op, s); err != nil {
		return err
	}
	if err := e.m.after(op, s, e.record(s)); err != nil {
		return err
	}
	return nil
}

// record records e on s at the driver and notes whether it went into a capture. While captures are in
// progress both happen in one steady state (Registry.Steady): a capture begun or ended on another thread
// in between (an end that a failed synchronize makes, without the GIL) would otherwise leave the books
// saying the opposite of the driver, and a later wait on e would join or refuse wrongly.
func (e *Event) record(s *Stream) error {
	// The stream is held for the driver call, inside the steady state (the order Stream.Destroy takes).
	note := func() error {
		return s.hold("event_record", func() error {
			if err := e.m.drv.EventRecord(e.m.ctx, e.h, s.h); err != nil {
				return err
			}
			c := s.capturing()
			e.mu.Lock()
			e.captured, e.recorded, e.in = c != nil, c == nil, c
			e.mu.Unlock()
			return nil
		})
	}
	if e.m.reg.active.Load() == 0 {
		// No capture can begin meanwhile: beginning one takes the GIL, which the caller holds.
		return note()
	}
	return e.m.reg.Steady(note)
}

func (e *Event) checkHostWait(op string) error {
	e.mu.Lock()
	captured := e.captured
	e.mu.Unlock()
	if captured {
		return CaptureError(cuda.ErrorCapturedEvent, op, fmt.Sprintf(
			"%s was last recorded inside a stream capture, so the host cannot wait on it or time it (the driver's error 907); record it on a stream that is not capturing, or wait on it from a stream with stream.wait(event)", e))
	}
	if c := e.m.unsafeCapture(); c != nil {
		return CaptureError(cuda.ErrorStreamCaptureUnsupported, op, unsafeMsg("waiting on "+e.String(), c, fixSync))
	}
	return nil
}

// Query says whether the work the event recorded has finished (an event never recorded has).
func (e *Event) Query() (bool, error) {
	const op = "event_query"
	if err := e.alive(op); err != nil {
		return false, err
	}
	refused, err := e.m.steadyChecked(func() error { return e.checkHostWait(op) }, func() error {
		return e.hold(op, func() error { return e.m.drv.EventQuery(e.m.ctx, e.h) })
	})
	if refused != nil {
		return false, refused
	}
	if cuda.ResultOf(err) == cuda.ErrorNotReady {
		return false, nil
	}
	return err == nil, e.m.after(op, nil, err)
}

// Synchronize waits until the work the event recorded has finished.
func (e *Event) Synchronize() error {
	const op = "event_synchronize"
	if err := e.alive(op); err != nil {
		return err
	}
	return e.m.recheck(e.block(op), nil)
}

// block is the blocking wait of Synchronize and of Wait's slices: cuEventSynchronize under the capture
// rules, entered as one step with their check (enterChecked).
func (e *Event) block(op string) error {
	return e.m.enterChecked(op, nil, func() error { return e.checkHostWait(op) }, func() error {
		return e.hold(op, func() error { return e.m.drv.EventSynchronize(e.m.ctx, e.h) })
	})
}

// Wait waits at most timeout for the event and says whether it has completed (see Stream.Wait).
func (e *Event) Wait(timeout time.Duration) (bool, error) {
	const op = "event_synchronize"
	done, err := waitFor(timeout, e.Query, &e.waiter, func() error { return e.block(op) })
	return done, e.m.recheck(err, func() error { return e.checkHostWait(op) })
}

// ElapsedTime returns the milliseconds between start's and e's completion. Both must be timing events
// recorded outside capture.
func (e *Event) ElapsedTime(start *Event) (float32, error) {
	const op = "event_elapsed_time"
	if err := e.alive(op); err != nil {
		return 0, err
	}
	if err := start.alive(op); err != nil {
		return 0, err
	}
	if err := e.m.sameDevice(op, start.m); err != nil {
		return 0, err
	}
	for _, ev := range []*Event{start, e} {
		if !ev.timing {
			return 0, cuda.NewError("cudacore."+op, cuda.ErrorInvalidHandle, fmt.Sprintf(
				"%s was created without timing; create both events with timing=True", ev))
		}
		ev.mu.Lock()
		captured, recorded := ev.captured, ev.recorded
		ev.mu.Unlock()
		if captured {
			return 0, CaptureError(cuda.ErrorCapturedEvent, op, fmt.Sprintf(
				"%s was last recorded inside a stream capture (the driver's error 907); time work outside capture", ev))
		}
		if !recorded {
			return 0, cuda.NewError("cudacore."+op, cuda.ErrorInvalidHandle, fmt.Sprintf(
				"%s has not been recorded; record both events first", ev))
		}
	}
	ms, err := e.m.drv.EventElapsedTime(e.m.ctx, start.h, e.h)
	return ms, e.m.after(op, nil, err)
}
