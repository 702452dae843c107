package memory

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// EventKind says what a recorded allocator event was.
type EventKind uint8

// The kinds of events a Recorder keeps.
const (
	EventAlloc   EventKind = iota + 1 // an allocation succeeded
	EventFree                         // a free succeeded
	EventOOM                          // an allocation failed for lack of memory (Size: what was asked)
	EventRelease                      // cached memory was given back (Size: the bytes no longer cached)
	EventTrim                         // the pool's reserve shrank (Size: the bytes returned to the device)
)

var eventNames = [...]string{"", "alloc", "free", "oom", "release", "trim"}

// kindPair marks a slot that holds frees and allocations of the same block, alternating (see slot).
const kindPair EventKind = 0xff

// maxPairs is how many free+allocation pairs one slot holds at most: a loop's temporary, freed and
// allocated again thousands of times a millisecond, costs a slot per maxPairs pairs, and a full ring still
// expands to a bounded number of events (2*maxPairs per slot).
const maxPairs = 8

// String is the kind's name as Python sees it: "alloc", "free", "oom", "release" or "trim".
func (k EventKind) String() string {
	if int(k) < len(eventNames) {
		return eventNames[k]
	}
	return "unknown"
}

// Event is one allocator event. Seq numbers events from 1 in the order they were recorded; a gap in the
// numbers of a snapshot means the ring overwrote the events between.
type Event struct {
	Seq    uint64
	Time   time.Duration // since the recorder was made (monotonic)
	Kind   EventKind
	Device int
	Ptr    cuda.DevicePtr
	Size   uint64
	Stream cuda.Stream
	InUse  uint64 // the allocator's bytes in use after the event
	Note   string // for OOM: the verdict's cause; for release: why; for alloc: a label (Python stack) when asked
}

// DefaultRecorderCapacity is the ring size of NewRecorder(0): about 320 KiB (a 64-byte slot and a note
// per event).
const DefaultRecorderCapacity = 4096

// slot is an event as the ring keeps it: one 64-byte cache line, no pointers (so storing it needs no
// write barrier). The event's note, rare on the hot path, lives in the parallel notes ring; noted says
// whether notes holds this slot's note. A slot of kind kindPair holds the commonest events of the
// allocator's hot path written once: pairs pairs (1 to maxPairs) of the free of a block and its allocation
// again on the same stream at the same time, numbered seq, seq+1, ...; inUse is after each allocation
// (after each free it was inUse-size).
type slot struct {
	seq    uint64
	time   time.Duration
	ptr    cuda.DevicePtr
	size   uint64
	stream cuda.Stream
	inUse  uint64
	device int
	kind   EventKind
	noted  bool
	pairs  uint8 // kindPair: how many pairs
}

// events is how many events the slot holds.
func (s *slot) events() uint64 {
	if s.kind == kindPair {
		return 2 * uint64(s.pairs)
	}
	return 1
}

// Recorder is a bounded ring of allocator events: the newest Capacity events are kept, older ones are
// overwritten. It is meant to stay on (bench/recorder.py measures it against the alloc+free pair), so an
// event costs one uncontended mutex (two atomic instructions), a store of one pointer-free cache line,
// no allocation and one read of the runtime's monotonic clock. The mutex stays because it is the cheaper
// way to publish a slot race-free: Go's atomic stores are locked instructions on amd64, so a lock-free
// ring of atomic fields (a sequence claim, then a version and every field stored atomically) measured
// about five times the lock's cost. The clock read (the vDSO's CLOCK_MONOTONIC, 20 to 40 ns) is what
// makes a burst plottable: events microseconds apart get their own times, where a coarse clock put a
// whole burst at one millisecond. Events the recycle log served carry their own fine times from C
// (cudacore/internal/recycle), read there without a system call. Times never go back in Seq order (a
// time equal to the previous event's is moved one nanosecond past it, so times are distinct too), and
// events are ordered exactly by Seq. A nil *Recorder records nothing, so callers need no check. Safe for
// concurrent use.
type Recorder struct {
	start time.Time // with a monotonic reading: Time is time.Since(start)

	enabled atomic.Bool // read before the lock: a disabled recorder costs one load

	mu    sync.Mutex
	ring  []slot        // len a power of two; slot k of those written is ring[k&mask]
	mask  uint64        // len(ring)-1
	notes []string      // notes[i] is ring[i]'s note when ring[i].noted
	seq   uint64        // events recorded so far; the next one gets seq+1
	slots uint64        // slots written so far (a pair slot holds two events)
	last  time.Duration // the newest event's Time
}

// NewRecorder returns an enabled recorder keeping the newest capacity events (0: the default), the
// capacity rounded up to a power of two.
func NewRecorder(capacity int) *Recorder {
	if capacity <= 0 {
		capacity = DefaultRecorderCapacity
	}
	r := &Recorder{start: time.Now()}
	r.setRing(pow2(capacity))
	r.enabled.Store(true)
	return r
}

// setRing replaces the ring by an empty one of n slots (a power of two).
func (r *Recorder) setRing(n int) {
	r.ring, r.notes, r.mask = make([]slot, n), make([]string, n), uint64(n-1)
}

// now returns the time for an event, since the recorder was made.
func (r *Recorder) now() time.Duration {
	return time.Since(r.start)
}

// after is t, or one nanosecond past the newest event's time if t is not after it: times are distinct
// and follow Seq. Called with r.mu held.
func (r *Recorder) after(t time.Duration) time.Duration {
	if t <= r.last && r.seq > 0 {
		t = r.last + 1
	}
	r.last = t
	return t
}

// Record appends e (its Seq and Time are set here) and returns its Seq; 0 when r is nil or disabled.
func (r *Recorder) Record(e Event) uint64 {
	if !r.on() {
		return 0
	}
	return r.record(e.Kind, e.Device, e.Ptr, e.Size, e.Stream, e.InUse, e.Note)
}

// on says whether r records: false for a nil or disabled recorder. It inlines, so the allocator's hot
// path checks it before evaluating an event's fields: a disabled recorder costs one atomic load there.
func (r *Recorder) on() bool {
	return r != nil && r.enabled.Load()
}

// record is Record of an enabled recorder, the event's fields passed in registers rather than as an
// Event: the allocator's hot path (alloc and free) calls it directly, after on.
func (r *Recorder) record(kind EventKind, device int, ptr cuda.DevicePtr, size uint64, stream cuda.Stream, inUse uint64, note string) uint64 {
	r.mu.Lock()
	// Read under the lock, and after the previous event's time: times follow Seq.
	t := r.after(r.now())
	r.seq++
	seq := r.seq
	r.put(seq, t, kind, device, ptr, size, stream, inUse)
	if note != "" {
		i := (r.slots - 1) & r.mask
		r.ring[i].noted, r.notes[i] = true, note
	}
	r.mu.Unlock()
	return seq
}

// stamp is the time of an event that happened at (zero: now), after the previous event's (times follow
// Seq), and makes it the newest. Called with r.mu held.
func (r *Recorder) stamp(at time.Time) time.Duration {
	if at.IsZero() {
		return r.after(r.now())
	}
	return r.after(at.Sub(r.start))
}

// recordRecycled records ops (Stack.Recycled) of device under one lock, in order, the bytes in use
// before the first being start. A free followed at once by the allocation of the same block at the same
// time takes one slot (kindPair). Each event keeps its own time (never before the previous event's: times
// follow Seq), so what happened before its batch was recorded keeps its time.
func (r *Recorder) recordRecycled(device int, start uint64, ops []Recycle) {
	inUse := start
	r.mu.Lock()
	var at time.Time // the last op's At, and its time on the recorder's clock
	var t time.Duration
	for i := 0; i < len(ops); i++ {
		op := &ops[i]
		// Times are compared as values, not with Equal: the ops of one batch that happened in the same
		// tick carry the same time.Time (a cheap comparison on the hot path; a false mismatch would only
		// cost a slot).
		if i == 0 || op.At != at {
			at = op.At
			t = r.stamp(at) // the ops that follow at the same time keep it: it is already the newest
		}
		if op.Free {
			inUse -= op.Size
			if i+1 < len(ops) {
				if a := &ops[i+1]; !a.Free && a.Ptr == op.Ptr && a.Size == op.Size && a.Stream == op.Stream && a.At == op.At {
					inUse += op.Size
					r.seq += 2
					i++
					// The same pair as the slot written last, at the same time: count it there.
					if last := &r.ring[(r.slots-1)&r.mask]; r.slots > 0 && last.kind == kindPair && last.pairs < maxPairs &&
						last.seq+last.events() == r.seq-1 && last.time == t && last.ptr == op.Ptr && last.size == op.Size &&
						last.stream == op.Stream && last.device == device && last.inUse == inUse {
						last.pairs++
						continue
					}
					r.put(r.seq-1, t, kindPair, device, op.Ptr, op.Size, op.Stream, inUse)
					r.ring[(r.slots-1)&r.mask].pairs = 1
					continue
				}
			}
			r.seq++
			r.put(r.seq, t, EventFree, device, op.Ptr, op.Size, op.Stream, inUse)
			continue
		}
		inUse += op.Size
		r.seq++
		r.put(r.seq, t, EventAlloc, device, op.Ptr, op.Size, op.Stream, inUse)
	}
	r.mu.Unlock()
}

// recordAt records one event that happened at time at (zero: now), with no note.
func (r *Recorder) recordAt(at time.Time, kind EventKind, device int, ptr cuda.DevicePtr, size uint64, stream cuda.Stream, inUse uint64) {
	r.mu.Lock()
	t := r.stamp(at)
	r.seq++
	r.put(r.seq, t, kind, device, ptr, size, stream, inUse)
	r.mu.Unlock()
}

// put writes the next slot: an event numbered seq, or the pair seq and seq+1 (kindPair), at time t,
// with no note. Called with r.mu held.
func (r *Recorder) put(seq uint64, t time.Duration, kind EventKind, device int, ptr cuda.DevicePtr, size uint64, stream cuda.Stream, inUse uint64) {
	e := &r.ring[r.slots&r.mask] // the capacity is a power of two: no division here
	r.slots++
	// Field by field: a composite literal is built on the stack and copied 16 bytes at a time, loads that
	// straddle its 8-byte stores and stall store forwarding.
	e.seq, e.time, e.ptr, e.size, e.stream, e.inUse, e.device, e.kind, e.noted = seq, t, ptr, size, stream, inUse, device, kind, false
}

// events appends the events that slot i holds (one, or two for a pair) to out. Called with r.mu held.
func (r *Recorder) events(out []Event, i uint64) []Event {
	s := &r.ring[i]
	e := Event{Seq: s.seq, Time: s.time, Kind: s.kind, Device: s.device, Ptr: s.ptr, Size: s.size,
		Stream: s.stream, InUse: s.inUse}
	if s.kind == kindPair {
		for j := range uint64(s.pairs) {
			free := e
			free.Seq, free.Kind, free.InUse = s.seq+2*j, EventFree, s.inUse-s.size
			alloc := e
			alloc.Seq, alloc.Kind = s.seq+2*j+1, EventAlloc
			out = append(out, free, alloc)
		}
		return out
	}
	if s.noted {
		e.Note = r.notes[i]
	}
	return append(out, e)
}

// kept is how many of the slots written the ring still holds. Called with r.mu held.
func (r *Recorder) kept() uint64 { return min(r.slots, uint64(len(r.ring))) }

// Label sets the note of the alloc event of ptr numbered seq, if the ring still holds it on its own
// slot (the allocation of a pair slot has no note: pairs are recorded only while allocations are not
// labelled).
func (r *Recorder) Label(seq uint64, ptr cuda.DevicePtr, note string) bool {
	if r == nil || seq == 0 {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := r.slots; k > r.slots-r.kept(); k-- {
		i := (k - 1) & r.mask
		e := &r.ring[i]
		if e.seq < seq {
			return false
		}
		if e.seq == seq {
			if e.kind == kindPair || e.ptr != ptr {
				return false
			}
			e.noted, r.notes[i] = note != "", note
			return true
		}
	}
	return false
}

// LastAlloc returns the seq of the newest alloc event of ptr still in the ring (0: none).
func (r *Recorder) LastAlloc(ptr cuda.DevicePtr) uint64 {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := r.slots; k > r.slots-r.kept(); k-- {
		e := &r.ring[(k-1)&r.mask]
		if e.seq != 0 && e.ptr == ptr {
			switch e.kind {
			case EventAlloc:
				return e.seq
			case kindPair:
				return e.seq + e.events() - 1
			}
		}
	}
	return 0
}

// Since returns the events with Seq > after still in the ring, oldest first, at most limit of the newest
// (limit <= 0: all), and the Seq of the newest event recorded so far.
func (r *Recorder) Since(after uint64, limit int) ([]Event, uint64) {
	if r == nil {
		return nil, 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	// The oldest slot to read: walk back from the newest while the slots hold events after `after`
	// (and, with a limit, until enough are found).
	first, found := r.slots, 0
	for first > r.slots-r.kept() {
		e := &r.ring[(first-1)&r.mask]
		if e.seq == 0 { // after Resize grew the ring, slots of events it did not keep are empty
			break
		}
		if e.seq+e.events()-1 <= after {
			break
		}
		first--
		found += int(e.events())
		if limit > 0 && found >= limit {
			break
		}
	}
	out := make([]Event, 0, found)
	for k := first; k < r.slots; k++ {
		out = r.events(out, k&r.mask)
	}
	// A pair slot at the start may hold events too many (at or before after, or beyond the limit).
	for len(out) > 0 && (out[0].Seq <= after || limit > 0 && len(out) > limit) {
		out = out[1:]
	}
	return out, r.seq
}

// SetEnabled turns recording on or off and returns the previous state. Events already kept stay.
func (r *Recorder) SetEnabled(on bool) bool {
	return r.enabled.Swap(on)
}

// Enabled says whether events are recorded.
func (r *Recorder) Enabled() bool {
	return r.enabled.Load()
}

// pow2 is the least power of two >= n (n > 0).
func pow2(n int) int {
	p := 1
	for p < n {
		p <<= 1
	}
	return p
}

// Resize keeps the newest capacity slots from now on (capacity > 0, rounded up to a power of two; a
// slot holds one event, or a free and the allocation of the same block after it), keeping as many of
// the slots held as fit; sequence numbers go on.
func (r *Recorder) Resize(capacity int) {
	if capacity <= 0 {
		return
	}
	capacity = pow2(capacity)
	r.mu.Lock()
	defer r.mu.Unlock()
	old, oldNotes, oldMask, keep := r.ring, r.notes, r.mask, min(r.kept(), uint64(capacity))
	r.setRing(capacity)
	for k := r.slots - keep; k < r.slots; k++ {
		r.ring[k&r.mask], r.notes[k&r.mask] = old[k&oldMask], oldNotes[k&oldMask]
	}
}

// Capacity is the ring's size.
func (r *Recorder) Capacity() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ring)
}
