package memory

import (
	"math"
	"sync/atomic"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/device"
)

// Pool allocates stream-ordered from a CUDA memory pool (cuMemAllocFromPoolAsync / cuMemFreeAsync): the
// device's default pool, or a pool it creates and owns (OwnPool). Freed memory stays reserved by the pool
// and is reused in stream order; the release threshold says how much the pool keeps across a
// synchronize.
//
// NewPool sets the pool's release threshold to the maximum by default: docs/contributing/driver-facts.md measured
// cuMemAllocAsync at 0.78 µs a pair that way, while a threshold of 0 gives all memory back to the device at
// every synchronize and makes the next allocation pay for it again. Reserved memory is given back by Trim,
// Release, and by the driver itself before it reports out of memory.
type Pool struct {
	d    *device.Device
	drv  cuda.Driver
	ctx  cuda.Context
	pool cuda.MemPool
	own  bool
	// adopted: the pool is another owner's (AdoptPool), whose attributes and lifetime are not this Pool's.
	adopted bool
	// held is what this Pool has allocated from the driver's pool and not freed: its share of a pool
	// that other allocators draw from too (AdoptPool). Allocations made while their stream captures are
	// graph memory, which the driver keeps outside the pool; they count here while they live.
	held atomic.Uint64

	// quiet, when set and true, forbids querying the pool (a capture is running: a query of its usage
	// succeeds but invalidates the capture); Reserved and Used then return the last values read.
	quiet                  func() bool
	lastReserved, lastUsed atomic.Uint64
}

// PoolOption configures NewPool.
type PoolOption func(*poolConfig)

type poolConfig struct {
	own       bool
	adopt     cuda.MemPool
	threshold uint64
	quiet     func() bool
}

// WithQuiet makes the pool answer Reserved and Used from the last values it read while quiet() is true:
// cuMemPoolGetAttribute of the pool's usage invalidates a stream capture (docs/contributing/driver-facts.md), so a
// caller that may be capturing passes a test for it.
func WithQuiet(quiet func() bool) PoolOption { return func(c *poolConfig) { c.quiet = quiet } }

// OwnPool makes NewPool create a pool of its own (cuMemPoolCreate) instead of using the device's default
// pool; Close destroys it. Memory in an own pool is not shared with other users of the default pool
// (cuMemAllocAsync from other libraries in the process).
func OwnPool() PoolOption { return func(c *poolConfig) { c.own = true } }

// AdoptPool makes NewPool allocate from pool, a pool of d that another owner made and keeps: the one the
// process shares (cudacore/internal/process: the shared pool). NewPool leaves its attributes to that
// owner, and Close neither destroys it nor trims it.
func AdoptPool(pool cuda.MemPool) PoolOption { return func(c *poolConfig) { c.adopt = pool } }

// WithReleaseThreshold sets the pool's release threshold (default: the maximum, keep everything).
func WithReleaseThreshold(bytes uint64) PoolOption {
	return func(c *poolConfig) { c.threshold = bytes }
}

// NewPool returns a Pool on d. It fails with NotSupported on a device without memory pools (TCC, some
// WSL setups), where New picks Sync instead; the caller owns the Pool and must Close it.
func NewPool(d *device.Device, opts ...PoolOption) (*Pool, error) {
	cfg := poolConfig{threshold: math.MaxUint64}
	for _, o := range opts {
		o(&cfg)
	}
	if !d.Properties().MemoryPoolsSupported || d.Properties().TCCDriver {
		return nil, cuda.NewError("cudacore.memory_pool", cuda.ErrorNotSupported,
			d.String()+" does not support stream-ordered memory pools; use the synchronous allocator (strategy \"sync\")")
	}
	p := &Pool{d: d, drv: d.Driver(), ctx: d.Context(), own: cfg.own, quiet: cfg.quiet}
	if cfg.adopt != 0 {
		p.pool, p.adopted = cfg.adopt, true
		return p, nil
	}
	var err error
	if cfg.own {
		p.pool, err = p.drv.MemPoolCreate(p.ctx, cuda.PoolProps{Device: d.Handle()})
	} else {
		p.pool, err = p.drv.DeviceDefaultMemPool(d.Handle())
	}
	if err != nil {
		return nil, err
	}
	if err := p.SetReleaseThreshold(cfg.threshold); err != nil {
		if cfg.own {
			_ = p.drv.MemPoolDestroy(p.ctx, p.pool)
		}
		return nil, err
	}
	return p, nil
}

// Allocate allocates size bytes ordered on s (cuMemAllocFromPoolAsync).
func (p *Pool) Allocate(size uint64, s cuda.Stream) (cuda.DevicePtr, error) {
	if err := checkSize(p.d, "cuMemAllocFromPoolAsync", size); err != nil {
		return 0, err
	}
	ptr, err := p.drv.MemAllocFromPoolAsync(p.ctx, size, p.pool, s)
	if err == nil {
		p.held.Add(size)
	}
	return ptr, err
}

// Deallocate frees ptr, of size bytes, ordered on s (cuMemFreeAsync): the pool reuses it once s has
// passed this point.
func (p *Pool) Deallocate(ptr cuda.DevicePtr, size uint64, s cuda.Stream) error {
	if err := p.drv.MemFreeAsync(p.ctx, ptr, s); err != nil {
		return err
	}
	p.held.Add(-size)
	return nil
}

// Held is what p has allocated from the driver's pool and not freed, its cached blocks included: the
// allocator's share of a pool that other libraries use too.
func (p *Pool) Held() uint64 { return p.held.Load() }

func (p *Pool) forget(_ cuda.DevicePtr, size uint64) error {
	p.held.Add(-size)
	return nil
}

// Adopted says whether the pool is another owner's (AdoptPool).
func (p *Pool) Adopted() bool { return p.adopted }

// Handle is the pool's driver handle.
func (p *Pool) Handle() cuda.MemPool { return p.pool }

// Device is the device the pool allocates on.
func (p *Pool) Device() *device.Device { return p.d }

// SetReleaseThreshold sets how many reserved bytes the pool keeps across a synchronize.
func (p *Pool) SetReleaseThreshold(bytes uint64) error {
	return p.drv.MemPoolSetAttribute(p.ctx, p.pool, cuda.PoolAttrReleaseThreshold, bytes)
}

// ReleaseThreshold reads the release threshold back.
func (p *Pool) ReleaseThreshold() (uint64, error) {
	return p.drv.MemPoolGetAttribute(p.ctx, p.pool, cuda.PoolAttrReleaseThreshold)
}

// Trim gives reserved but unused memory back to the device until the pool reserves at most keep bytes
// (cuMemPoolTrimTo). Memory freed on a stream whose work has not finished is not trimmed: synchronize first.
func (p *Pool) Trim(keep uint64) error { return p.drv.MemPoolTrimTo(p.ctx, p.pool, keep) }

// Reserved is the memory the pool holds from the device (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT).
func (p *Pool) Reserved() (uint64, error) {
	return p.query(cuda.PoolAttrReservedMemCurrent, &p.lastReserved)
}

func (p *Pool) query(attr cuda.MemPoolAttribute, last *atomic.Uint64) (uint64, error) {
	if p.quiet != nil && p.quiet() {
		return last.Load(), nil
	}
	v, err := p.drv.MemPoolGetAttribute(p.ctx, p.pool, attr)
	if err == nil {
		last.Store(v)
	}
	return v, err
}

// lastCached is Cached from the last readings of Reserved and Used, without asking the driver.
func (p *Pool) lastCached() uint64 {
	r, u := p.lastReserved.Load(), p.lastUsed.Load()
	if u > r {
		return 0
	}
	return r - u
}

// Used is the memory of the pool handed out (CU_MEMPOOL_ATTR_USED_MEM_CURRENT).
func (p *Pool) Used() (uint64, error) {
	return p.query(cuda.PoolAttrUsedMemCurrent, &p.lastUsed)
}

// Cached is Reserved minus Used: what the pool holds for reuse. A failed query counts as 0.
func (p *Pool) Cached() uint64 {
	r, err := p.Reserved()
	if err != nil {
		return 0
	}
	u, err := p.Used()
	if err != nil || u > r {
		return 0
	}
	return r - u
}

// Release gives everything the pool holds but does not hand out back to the device. It synchronizes the
// context first: a block freed with cuMemFreeAsync stays in the pool, untrimmable, until its stream has
// reached the free (measured on the H100: without the synchronize a trim after freeing 70 GiB returned
// nothing). Do not call it while a stream of the device is capturing.
func (p *Pool) Release() error {
	if err := p.drv.CtxSynchronize(p.ctx); err != nil {
		return err
	}
	return p.Trim(0)
}

// Close destroys an own pool (blocks still allocated from it stay valid until freed, as the driver
// does), trims the default pool and leaves an adopted one to its owner. The Pool must not be used afterwards.
func (p *Pool) Close() error {
	switch {
	case p.adopted:
		return nil
	case p.own:
		return p.drv.MemPoolDestroy(p.ctx, p.pool)
	}
	return p.Trim(0)
}

// Sync allocates with cuMemAlloc / cuMemFree. The stream is ignored: the memory is usable on every
// stream at once, and cuMemFree synchronizes the device before it returns (~73 µs a pair on the H100),
// which is why the pool is preferred wherever the device supports one. It works on every device.
type Sync struct {
	d   *device.Device
	drv cuda.Driver
	ctx cuda.Context
}

// NewSync returns the synchronous resource of d.
func NewSync(d *device.Device) *Sync { return &Sync{d: d, drv: d.Driver(), ctx: d.Context()} }

func (r *Sync) Allocate(size uint64, _ cuda.Stream) (cuda.DevicePtr, error) {
	if err := checkSize(r.d, "cuMemAlloc_v2", size); err != nil {
		return 0, err
	}
	return r.drv.MemAlloc(r.ctx, size)
}

// Deallocate frees p at once (cuMemFree_v2, which waits for the device): s is ignored.
func (r *Sync) Deallocate(p cuda.DevicePtr, _ uint64, _ cuda.Stream) error {
	return r.drv.MemFree(r.ctx, p)
}

// Device is the device r allocates on.
func (r *Sync) Device() *device.Device { return r.d }

// Managed allocates unified memory (cuMemAllocManaged with CU_MEM_ATTACH_GLOBAL), accessible from the
// host and every device, freed with cuMemFree. The stream is ignored. It can exceed the device's memory
// (pages migrate on demand), so Allocate does not check the size against the device's total.
type Managed struct {
	d   *device.Device
	drv cuda.Driver
	ctx cuda.Context
}

// NewManaged returns the managed-memory resource of d.
func NewManaged(d *device.Device) *Managed { return &Managed{d: d, drv: d.Driver(), ctx: d.Context()} }

func (r *Managed) Allocate(size uint64, _ cuda.Stream) (cuda.DevicePtr, error) {
	if size == 0 {
		return 0, errZeroSize()
	}
	return r.drv.MemAllocManaged(r.ctx, size, cuda.MemAttachGlobal)
}

func (r *Managed) Deallocate(p cuda.DevicePtr, _ uint64, _ cuda.Stream) error {
	return r.drv.MemFree(r.ctx, p)
}

// Device is the device r allocates on.
func (r *Managed) Device() *device.Device { return r.d }

// Pinned allocates page-locked host memory (cuMemHostAlloc), which makes asynchronous copies truly
// asynchronous (55 GB/s against 7.6 GB/s from pageable memory on the H100). It keeps its own counters.
// The slice AllocateHost returns is outside the Go heap and owned by the caller until FreeHost; using it
// after FreeHost faults.
type Pinned struct {
	d     *device.Device
	drv   cuda.Driver
	ctx   cuda.Context
	flags uint32

	inUse, peak, allocs, frees atomic.Uint64
}

// NewPinned returns the pinned host resource of d. flags are CU_MEMHOSTALLOC_* (0 is the usual choice).
func NewPinned(d *device.Device, flags uint32) *Pinned {
	return &Pinned{d: d, drv: d.Driver(), ctx: d.Context(), flags: flags}
}

// AllocateHost returns size bytes of pinned host memory.
func (r *Pinned) AllocateHost(size uint64) ([]byte, error) {
	if size == 0 {
		return nil, errZeroSize()
	}
	b, err := r.drv.MemHostAlloc(r.ctx, size, r.flags)
	if err != nil {
		return nil, err
	}
	r.allocs.Add(1)
	storeMax(&r.peak, r.inUse.Add(uint64(len(b))))
	return b, nil
}

// FreeHost frees memory from AllocateHost; b must be the whole slice AllocateHost returned.
func (r *Pinned) FreeHost(b []byte) error {
	if len(b) == 0 {
		return invalid("cuMemFreeHost", "empty slice: not memory from AllocateHost")
	}
	if err := r.drv.MemFreeHost(r.ctx, b); err != nil {
		return err
	}
	r.frees.Add(1)
	r.inUse.Add(-uint64(len(b)))
	return nil
}

// PinnedStats are a Pinned resource's counters.
type PinnedStats struct {
	InUse, PeakInUse, Allocations, Frees uint64
}

// Stats returns r's counters.
func (r *Pinned) Stats() PinnedStats {
	return PinnedStats{InUse: r.inUse.Load(), PeakInUse: r.peak.Load(), Allocations: r.allocs.Load(), Frees: r.frees.Load()}
}

// New returns the base resource for strategy on d: a Pool on the default pool for StrategyPool, Sync for
// StrategySync. An empty strategy means d.Strategy().
func New(d *device.Device, strategy device.Strategy) (Resource, error) {
	if strategy == "" {
		strategy = d.Strategy()
	}
	switch strategy {
	case device.StrategyPool:
		return NewPool(d)
	case device.StrategySync:
		return NewSync(d), nil
	}
	return nil, invalid("cudacore.allocation_strategy", "unknown allocation strategy \""+string(strategy)+"\": use \"pool\" or \"sync\"")
}

// storeMax raises a to at least v.
func storeMax(a *atomic.Uint64, v uint64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}
