package memory

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/device"
)

// StackOptions configure NewStack; the zero value is the usual choice.
type StackOptions struct {
	Strategy    device.Strategy             // "" takes the device's (d.Strategy())
	OwnPool     bool                        // pool strategy: a pool of its own rather than the device's default pool
	Pool        cuda.MemPool                // pool strategy: allocate from this pool of another owner (AdoptPool)
	PoolMaxSize uint64                      // the maximum size Pool was made with (0: none), for the verdict
	NoCache     bool                        // pool strategy: leave out the size-class Cache
	Cache       CacheOptions                // its bounds
	Limit       uint64                      // byte limit, 0 for none; SetLimit changes it later
	OnOOM       func(requested uint64) bool // called by Retry before its one retry; false gives up
	Track       bool                        // record live allocations (Live) and refuse unknown frees
	TraceFrames int                         // with Track: stack frames captured per allocation
	Quiet       func() bool                 // pool strategy: true while a capture runs (WithQuiet, and the Cache's Quiet)
	// Recorder receives the stack's events (alloc, free, oom, release, trim); nil records nothing.
	Recorder *Recorder
	// Others lists other processes' memory on the device, for the out-of-memory verdict (PoolState.Others).
	Others func() ([]ProcessUsage, bool)
	// Outside is what this process holds on the device outside the stack (PoolState.Outside); nil: nothing.
	Outside func() uint64
}

// Stack is the per-device allocator the facade uses, composed bottom to top:
//
//	base (Pool or Sync, by strategy) -> Cache (pool only) -> Retry -> Limit -> Stats -> Tracker (optional)
//
// so a cache hit costs no driver call, an out-of-memory failure first releases the cache and the pool's
// reserve and retries, the limit counts what callers asked for, the statistics see every call that
// reached the allocator (limit hits included), and the tracker, outermost, stops a double free before it
// reaches anything below.
//
// Every out-of-memory failure of Allocate is returned as the user-facing error of OutOfMemory, with this
// stack's in-use, cached and limit. A failed Allocate leaves everything as it was: the limit's
// reservation is undone, the statistics' InUse is unchanged, and the device's memory in use (cuMemGetInfo)
// is what it was before the call, or less when Retry released cached memory on the way.
//
// The Stack owns its base resource; Close releases the cache and closes the pool.
type Stack struct {
	d       *device.Device
	pool    *Pool
	cache   *Cache
	limit   *Limit
	stats   *Stats
	tracker *Tracker
	top     Resource
	rec     *Recorder
	ordinal int
	others  func() ([]ProcessUsage, bool)
	outside func() uint64
	maxSize uint64 // StackOptions.PoolMaxSize
	// capturing counts the streams marked by SetCapturing: while any is, the out-of-memory probe (a
	// cuMemAlloc, an unsafe call that would invalidate a capture) is skipped.
	capturing atomic.Int64
	// probeLeft holds the probe's blocks whose free the driver refused: freed again by the next probe,
	// Release and Close, so that a refused free loses no memory.
	probeMu   sync.Mutex
	probeLeft []cuda.DevicePtr
}

// NewStack builds the stack for d.
func NewStack(d *device.Device, opts StackOptions) (*Stack, error) {
	strategy := opts.Strategy
	if strategy == "" {
		strategy = d.Strategy()
	}
	s := &Stack{d: d, rec: opts.Recorder, ordinal: d.Properties().Ordinal, others: opts.Others, outside: opts.Outside,
		maxSize: opts.PoolMaxSize}
	var r Resource
	switch strategy {
	case device.StrategyPool:
		var popts []PoolOption
		if opts.OwnPool {
			popts = append(popts, OwnPool())
		}
		if opts.Pool != 0 {
			popts = append(popts, AdoptPool(opts.Pool))
		}
		if opts.Quiet != nil {
			popts = append(popts, WithQuiet(opts.Quiet))
		}
		p, err := NewPool(d, popts...)
		if err != nil {
			return nil, err
		}
		s.pool, r = p, p
		if !opts.NoCache {
			if opts.Cache.Quiet == nil {
				opts.Cache.Quiet = opts.Quiet
			}
			s.cache = NewCache(p, opts.Cache)
			r = s.cache
		}
	default:
		base, err := New(d, strategy)
		if err != nil {
			return nil, err
		}
		r = base
	}
	r = NewRetry(r, d.Driver(), d.Context(), opts.OnOOM)
	s.limit = NewLimit(r, opts.Limit)
	s.stats = NewStats(s.limit)
	s.top = s.stats
	if opts.Track {
		s.tracker = NewTracker(s.stats, opts.TraceFrames)
		s.top = s.tracker
	}
	return s, nil
}

// Allocate allocates size bytes for use on st. Size 0 is InvalidValue; more than the device's total
// memory is the out-of-memory error without a driver call.
func (s *Stack) Allocate(size uint64, st cuda.Stream) (cuda.DevicePtr, error) {
	p, err := s.top.Allocate(size, st)
	if err != nil {
		return 0, s.wrap(size, st, err)
	}
	if s.rec.on() {
		s.rec.record(EventAlloc, s.ordinal, p, size, st, s.stats.InUse(), "")
	}
	return p, nil
}

// AllocateLabeled is Allocate recording label as where the allocation was made (with Track).
func (s *Stack) AllocateLabeled(size uint64, st cuda.Stream, label string) (cuda.DevicePtr, error) {
	if s.tracker == nil {
		return s.Allocate(size, st)
	}
	p, err := s.tracker.AllocateLabeled(size, st, label)
	if err != nil {
		return 0, s.wrap(size, st, err)
	}
	s.rec.Record(Event{Kind: EventAlloc, Device: s.ordinal, Ptr: p, Size: size, Stream: st, InUse: s.stats.InUse(), Note: label})
	return p, nil
}

// Label records label as where the live allocation p was made: in the tracker (Live) and on p's newest
// alloc event in the recorder. It says whether either knew p.
func (s *Stack) Label(p cuda.DevicePtr, label string) bool {
	ok := s.rec.Label(s.rec.LastAlloc(p), p, label)
	if s.tracker != nil && s.tracker.SetLabel(p, label) {
		ok = true
	}
	return ok
}

// wrap turns an out-of-memory failure into the user's error (OutOfMemory, with this stack's state and
// the verdict) and records it: a release event for what Retry released first, then the oom event.
func (s *Stack) wrap(size uint64, st cuda.Stream, err error) error {
	if !errors.Is(err, cuda.ErrOutOfMemory) {
		return err
	}
	var rt *retriedError
	if errors.As(err, &rt) && rt.released > 0 {
		s.rec.Record(Event{Kind: EventRelease, Device: s.ordinal, Size: rt.released, InUse: s.stats.InUse(), Note: "oom-retry"})
	}
	ps := s.state(capturedElsewhere(s.d.Driver(), s.d.Context(), st))
	oom := OutOfMemory(s.d, size, err, ps)
	cause, _ := oom.Field("cause")
	seq := s.rec.Record(Event{Kind: EventOOM, Device: s.ordinal, Size: size, Stream: st, InUse: ps.InUse, Note: cause})
	if seq != 0 {
		oom.Fields = append(oom.Fields, field("event", seq))
	}
	return oom
}

// State is what the stack holds now, for the out-of-memory verdict of this allocation or of another
// allocation of the device made outside the stack.
func (s *Stack) State() PoolState { return s.state(false) }

// StateOn is State for an allocation that failed on stream st outside the stack (another library's):
// while another library captures on st, the pool's last readings and no probe, as for the stack's own
// failures on such a stream.
func (s *Stack) StateOn(st cuda.Stream) PoolState {
	return s.state(capturedElsewhere(s.d.Driver(), s.d.Context(), st))
}

// state is State; captured (another library captures on the allocation's stream) takes the pool's last
// readings and no probe, since a query of the pool's usage or a probe allocation would invalidate that
// capture.
func (s *Stack) state(captured bool) PoolState {
	ps := PoolState{InUse: s.stats.InUse(), Limit: s.limit.Limit(), Pool: s.pool != nil, Others: s.others}
	if captured {
		ps.Cached = s.lastCached()
	} else {
		ps.Cached, ps.Probe = Cached(s.top), s.probe
	}
	if s.outside != nil {
		ps.Outside = s.outside()
	}
	if s.pool != nil {
		used := s.pool.lastUsed.Load()
		if !captured {
			if u, err := s.pool.Used(); err == nil {
				used = u
			}
		}
		if held := s.pool.Held(); used > held {
			ps.PoolOthers = used - held
		}
	}
	if s.maxSize != 0 && s.pool != nil {
		ps.MaxSize = s.maxSize
		if captured {
			ps.PoolReserved = s.pool.lastReserved.Load()
		} else if r, err := s.pool.Reserved(); err == nil {
			ps.PoolReserved = r
		}
	}
	return ps
}

// lastCached is Cached(s.top) from the pool's last readings: no driver call.
func (s *Stack) lastCached() uint64 {
	var n uint64
	if s.cache != nil {
		n = s.cache.cached.Load()
	}
	if s.pool != nil {
		n += s.pool.lastCached()
	}
	return n
}

// probe allocates and frees one block of size outside the pool (cuMemAlloc): whether the device has it.
// While a stream captures it answers false without calling the driver (the verdict is then
// fragmentation): cuMemAlloc would invalidate the capture.
func (s *Stack) probe(size uint64) bool {
	if s.capturing.Load() > 0 {
		return false
	}
	_ = s.freeProbes()
	drv, ctx := s.d.Driver(), s.d.Context()
	p, err := drv.MemAlloc(ctx, size)
	if err != nil {
		return false
	}
	if drv.MemFree(ctx, p) != nil {
		s.probeMu.Lock()
		s.probeLeft = append(s.probeLeft, p)
		s.probeMu.Unlock()
	}
	return true
}

// freeProbes frees the probe's blocks whose free the driver refused before; those it refuses again
// stay for the next try. Not while a stream captures (cuMemFree would invalidate the capture).
func (s *Stack) freeProbes() error {
	if s.capturing.Load() > 0 {
		return nil
	}
	s.probeMu.Lock()
	defer s.probeMu.Unlock()
	drv, ctx := s.d.Driver(), s.d.Context()
	var errs []error
	kept := s.probeLeft[:0]
	for _, p := range s.probeLeft {
		if err := drv.MemFree(ctx, p); err != nil {
			kept = append(kept, p)
			errs = append(errs, err)
		}
	}
	s.probeLeft = kept
	return errors.Join(errs...)
}

// Deallocate frees p (allocated with size, used last on st). With Track, an unknown pointer or a second
// free is an InvalidValue error and reaches nothing below.
func (s *Stack) Deallocate(p cuda.DevicePtr, size uint64, st cuda.Stream) error {
	if err := s.top.Deallocate(p, size, st); err != nil {
		return err
	}
	if s.rec.on() {
		s.rec.record(EventFree, s.ordinal, p, size, st, s.stats.InUse(), "")
	}
	return nil
}

// DeallocateAt is Deallocate of a free made at time at that reaches the stack later (a free of the
// recycle log): the recorder's event keeps that time (never before the previous event's).
func (s *Stack) DeallocateAt(p cuda.DevicePtr, size uint64, st cuda.Stream, at time.Time) error {
	if err := s.top.Deallocate(p, size, st); err != nil {
		return err
	}
	if s.rec.on() {
		s.rec.recordAt(at, EventFree, s.ordinal, p, size, st, s.stats.InUse())
	}
	return nil
}

// AllocateTiles is the package's AllocateTiles on this stack.
func (s *Stack) AllocateTiles(count int, tileSize uint64, st cuda.Stream, progress func(done, total int) bool) ([]cuda.DevicePtr, error) {
	return AllocateTiles(s, count, tileSize, st, progress)
}

// Admit is the package's Admit on this stack.
func (s *Stack) Admit(count int, tileSize uint64) (fits bool, free, cached uint64, err error) {
	return Admit(s.d, s, count, tileSize)
}

// Stats returns the counters, with Cached (cache plus pool reserve not handed out), Reserved (the pool's
// reserved memory; for Sync, InUse) and Limit. Cached and Reserved cost driver queries.
func (s *Stack) Stats() StatsSnapshot {
	snap := s.stats.Snapshot()
	snap.Cached = Cached(s.top)
	snap.Reserved = snap.InUse
	if s.pool != nil {
		if r, err := s.pool.Reserved(); err == nil {
			snap.Reserved = r
		}
	}
	snap.Limit = s.limit.Limit()
	return snap
}

// ResetPeak sets the peak to the bytes in use now.
func (s *Stack) ResetPeak() { s.stats.ResetPeak() }

// Release gives every cached block and the pool's unused reserve back to the device (and the probe's
// blocks whose free the driver refused), and records a release event (the bytes no longer cached) and a
// trim event (the bytes the pool's reserve shrank by), each only when it is not 0.
func (s *Stack) Release() error {
	if s.rec == nil {
		return errors.Join(Release(s.top), s.freeProbes())
	}
	cachedBefore, reservedBefore := Cached(s.top), s.reserved()
	err := errors.Join(Release(s.top), s.freeProbes())
	cachedAfter, reservedAfter := Cached(s.top), s.reserved()
	// A release that freed nothing is not an event worth a slot of the ring.
	if released := cachedBefore - min(cachedBefore, cachedAfter); released > 0 {
		s.rec.Record(Event{Kind: EventRelease, Device: s.ordinal, Size: released, InUse: s.stats.InUse(), Note: "release"})
	}
	if trimmed := reservedBefore - min(reservedBefore, reservedAfter); trimmed > 0 {
		s.rec.Record(Event{Kind: EventTrim, Device: s.ordinal, Size: trimmed, InUse: s.stats.InUse()})
	}
	return err
}

// reserved is the pool's reserved memory (0 for Sync, or when the query fails).
func (s *Stack) reserved() uint64 {
	if s.pool == nil {
		return 0
	}
	r, _ := s.pool.Reserved()
	return r
}

// Recorder is the stack's event recorder (nil: none).
func (s *Stack) Recorder() *Recorder { return s.rec }

// ReleaseStream frees the blocks cached for st; call it before destroying st.
func (s *Stack) ReleaseStream(st cuda.Stream) error {
	if s.cache == nil {
		return nil
	}
	return s.cache.ReleaseStream(st)
}

// SetCapturing marks st as being captured into a graph (or no longer), so that the cache keeps out of
// the capture (see Cache.SetCapturing) and the out-of-memory verdict makes no probe allocation.
func (s *Stack) SetCapturing(st cuda.Stream, on bool) {
	if on {
		s.capturing.Add(1)
	} else {
		s.capturing.Add(-1)
	}
	if s.cache != nil {
		s.cache.SetCapturing(st, on)
	}
}

// Cached is what Stats reports as Cached.
func (s *Stack) Cached() uint64 { return Cached(s.top) }

// SetLimit sets the byte limit (0: none). It takes effect for the next allocation.
func (s *Stack) SetLimit(bytes uint64) { s.limit.SetLimit(bytes) }

// Limit returns the byte limit (0: none).
func (s *Stack) Limit() uint64 { return s.limit.Limit() }

// Live returns the live allocations, oldest first; nil unless the stack was built with Track.
func (s *Stack) Live() []Allocation {
	if s.tracker == nil {
		return nil
	}
	return s.tracker.Live()
}

// OverLimit says whether a byte limit is set and what is handed out exceeds it (the limit was lowered
// below what was in use).
func (s *Stack) OverLimit() bool {
	lim := s.limit.Limit()
	return lim != 0 && s.limit.InUse() > lim
}

// Tracking says whether the stack records live allocations.
func (s *Stack) Tracking() bool { return s.tracker != nil }

// Pool is the stack's pool, or nil for the synchronous strategy.
func (s *Stack) Pool() *Pool { return s.pool }

// Cache is the stack's size-class cache, or nil.
func (s *Stack) Cache() *Cache { return s.cache }

// Recycle is one half of a block freed and allocated again outside the stack, on the same stream and
// with the same size (the recycle log of cudacore/internal/recycle): its free, or its allocation.
type Recycle struct {
	At     time.Time // when it happened (zero: now)
	Free   bool
	Ptr    cuda.DevicePtr
	Size   uint64
	Stream cuda.Stream
}

// Recycled accounts for ops, in order. The blocks never left their owner, so nothing below the statistics
// sees them, and the limit, which counts what is handed out, is unchanged by each free and its
// allocation; the statistics and the recorder see every op as if it had come through Deallocate or
// Allocate, at its own time (the recorder's events in one batch). Not for a tracking stack.
func (s *Stack) Recycled(ops []Recycle) {
	if len(ops) == 0 {
		return
	}
	start := s.stats.apply(ops)
	if !s.rec.on() {
		return
	}
	s.rec.recordRecycled(s.ordinal, start, ops)
}

// Device is the stack's device.
func (s *Stack) Device() *device.Device { return s.d }

// Unwrap returns the outermost adaptor.
func (s *Stack) Unwrap() Resource { return s.top }

// Close releases the cache and closes the pool. Memory still allocated stays valid until freed (through
// the driver); the Stack must not be used afterwards.
func (s *Stack) Close() error {
	err := errors.Join(Release(s.top), s.freeProbes())
	if s.pool != nil {
		if cerr := s.pool.Close(); err == nil {
			err = cerr
		}
	}
	return err
}
