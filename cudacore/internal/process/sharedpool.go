package process

import (
	"errors"
	"fmt"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/device"
	"github.com/cudacore/cudacore/pkg/memory"
)

// One pool for the process (docs/contributing/design.md, "One pool for the process"): a device's shared
// pool is the memory pool that cudacore's allocator draws from and that it makes the device's current
// pool (cuDeviceSetMemPool), so that every library allocating with cuMemAllocAsync / cudaMallocAsync
// (PyTorch's cudaMallocAsync backend, CuPy's MemoryAsyncPool) draws from it too, and libraries that take a
// pool by handle (RMM) are given it. The Python layer wires those libraries; this file owns the pool.

// ShareOptions say how a device's shared pool is made (ShareProcessPool).
type ShareOptions struct {
	// UseDefault shares the device's default pool (cuDeviceGetDefaultMemPool) instead of a pool cudacore
	// creates: the pool the CUDA runtime's default allocations and XLA's cuda_async allocator use, but one
	// whose properties cannot be chosen (no maximum size, no IPC handles).
	UseDefault bool
	// ReleaseThreshold is what the pool keeps reserved across a synchronize (math.MaxUint64: everything).
	ReleaseThreshold uint64
	// MaxSize caps what a pool cudacore creates may reserve (0: no cap); needs CUDA 12.2.
	MaxSize uint64
	// IPC makes a pool cudacore creates exportable to other processes (POSIX file descriptors).
	IPC bool
}

// SharedPool is a device's shared pool.
type SharedPool struct {
	ShareOptions
	Handle cuda.MemPool
	// Previous is the device's current pool before ShareProcessPool made Handle current: UnshareProcessPool makes it
	// current again.
	Previous cuda.MemPool
	// previousThreshold is the default pool's release threshold before UseDefault changed it.
	previousThreshold uint64
}

// Owned says whether cudacore created the pool (and destroys it on UnshareProcessPool).
func (sp *SharedPool) Owned() bool { return !sp.UseDefault }

const opShare = "cudacore.share_pool"

// ProcessPool returns the device's shared pool, if it shares one.
func (d *Device) ProcessPool() (SharedPool, bool) {
	if sp := d.shared.Load(); sp != nil {
		return *sp, true
	}
	return SharedPool{}, false
}

// checkShare refuses what no driver call could make work: a device without memory pools (the synchronous
// strategy's devices), a device whose allocator runs the synchronous strategy, and properties the default
// pool cannot have.
func (d *Device) checkShare(opts ShareOptions) error {
	if p := d.Properties(); !p.MemoryPoolsSupported || p.TCCDriver {
		return cuda.NewError(opShare, cuda.ErrorNotSupported, fmt.Sprintf(
			"%s has no stream-ordered memory pools (%s), so there is no pool to share: let each library allocate "+
				"through cudacore's allocator instead (cudacore.interop.cupy_allocator, use_torch_allocator, "+
				"NumbaMemoryManager), which works on the synchronous strategy", d, d.StrategyReason()))
	}
	if d.Strategy() != device.StrategyPool {
		return cuda.NewError(opShare, cuda.ErrorNotSupported, fmt.Sprintf(
			"%s allocates with the %q strategy, outside any pool: set_allocation_strategy(\"pool\") first, or let each "+
				"library allocate through cudacore's allocator (cudacore.interop.cupy_allocator, use_torch_allocator, "+
				"NumbaMemoryManager)", d, d.Strategy()))
	}
	if opts.UseDefault && (opts.MaxSize != 0 || opts.IPC) {
		return cuda.NewError(opShare, cuda.ErrorInvalidValue,
			"the device's default pool has no maximum size and no IPC handles (the driver makes it): ask for a pool of cudacore's own to have them")
	}
	return nil
}

// ShareProcessPool makes the device's shared pool with opts, moves cudacore's allocator into it and makes it the
// device's current pool. A device that shares a pool already keeps it: the same kind and properties
// change only its release threshold; others are refused (UnshareProcessPool first). It is refused while a
// stream captures, and, for a pool of cudacore's own, while cudacore's allocator has memory handed out
// (those blocks are in the old pool). On failure nothing has changed.
func (d *Device) ShareProcessPool(opts ShareOptions) (SharedPool, error) {
	if err := d.checkShare(opts); err != nil {
		return SharedPool{}, err
	}
	if _, err := d.FlushOrphans(); err != nil {
		return SharedPool{}, err
	}
	var out SharedPool
	err := captures.Steady(func() error {
		var err error
		out, err = d.shareProcessPool(opts)
		return err
	})
	return out, err
}

func (d *Device) shareProcessPool(opts ShareOptions) (SharedPool, error) {
	devMu.Lock()
	defer devMu.Unlock()
	d.inFlight.Lock()
	defer d.inFlight.Unlock()
	if n := ActiveCaptures(); n > 0 {
		return SharedPool{}, cuda.NewError(opShare, cuda.ErrorStreamCaptureUnsupported, fmt.Sprintf(
			"cannot share a pool of %s while %d stream capture(s) are in progress; end or abort them first", d, n))
	}
	drv, ctx, dev := d.Driver(), d.Context(), d.Handle()
	if cur := d.shared.Load(); cur != nil {
		if cur.UseDefault != opts.UseDefault || cur.MaxSize != opts.MaxSize || cur.IPC != opts.IPC {
			return SharedPool{}, cuda.NewError(opShare, cuda.ErrorIllegalState, fmt.Sprintf(
				"%s already shares memory pool %#x, made with other properties (%s): undo that first (SharedPool.undo())",
				d, uint64(cur.Handle), cur.describe()))
		}
		if err := drv.MemPoolSetAttribute(ctx, cur.Handle, cuda.PoolAttrReleaseThreshold, opts.ReleaseThreshold); err != nil {
			return SharedPool{}, err
		}
		next := *cur
		next.ReleaseThreshold = opts.ReleaseThreshold
		d.shared.Store(&next)
		return next, nil
	}

	prev, err := drv.DeviceGetMemPool(dev)
	if err != nil {
		return SharedPool{}, err
	}
	sp := &SharedPool{ShareOptions: opts, Previous: prev}
	if opts.UseDefault {
		if sp.Handle, err = drv.DeviceDefaultMemPool(dev); err != nil {
			return SharedPool{}, err
		}
		if sp.previousThreshold, err = drv.MemPoolGetAttribute(ctx, sp.Handle, cuda.PoolAttrReleaseThreshold); err != nil {
			return SharedPool{}, err
		}
	} else {
		if err := d.checkReplaceLocked(opShare, "move the allocator into a shared pool on"); err != nil {
			return SharedPool{}, err
		}
		if opts.MaxSize != 0 {
			v, err := drv.Version()
			if err != nil {
				return SharedPool{}, err
			}
			if v < cuda.PoolMaxSizeVersion {
				return SharedPool{}, cuda.MaxSizeUnsupported(opShare, v)
			}
		}
		props := cuda.PoolProps{Device: dev, MaxSize: opts.MaxSize}
		if opts.IPC {
			props.HandleTypes = cuda.HandlePosixFD
		}
		if sp.Handle, err = drv.MemPoolCreate(ctx, props); err != nil {
			if r := cuda.ResultOf(err); opts.IPC && (r == cuda.ErrorNotSupported || r == cuda.ErrorInvalidValue) {
				return SharedPool{}, cuda.NewError(opShare, cuda.ErrorNotSupported, fmt.Sprintf(
					"the driver refuses a memory pool with IPC handles on %s (%v): share one without (ipc=False)", d, err))
			}
			return SharedPool{}, err
		}
	}
	// From here on a failure puts back what was done.
	undoPool := func() {
		if opts.UseDefault {
			_ = drv.MemPoolSetAttribute(ctx, sp.Handle, cuda.PoolAttrReleaseThreshold, sp.previousThreshold)
		} else {
			_ = drv.MemPoolDestroy(ctx, sp.Handle)
		}
	}
	if err := drv.MemPoolSetAttribute(ctx, sp.Handle, cuda.PoolAttrReleaseThreshold, opts.ReleaseThreshold); err != nil {
		undoPool()
		return SharedPool{}, err
	}
	if !opts.UseDefault {
		// The default pool holds the allocator already; a later rebuild adopts it (setStrategy), so that
		// the new stack does not set its own release threshold over the one asked here.
		if err := d.replaceStackLocked(d.stackOptionsNow(sp.Handle, sp.MaxSize)); err != nil {
			undoPool()
			return SharedPool{}, err
		}
	}
	if err := drv.DeviceSetMemPool(dev, sp.Handle); err != nil {
		if !opts.UseDefault {
			_ = d.replaceStackLocked(d.stackOptionsNow(0, 0))
		}
		undoPool()
		return SharedPool{}, err
	}
	d.shared.Store(sp)
	return *sp, nil
}

// stackOptionsNow are the options of a new allocator for the device that keeps what the current one
// does (live-allocation tracking) and allocates from pool (0: the default pool) of maximum size maxSize.
func (d *Device) stackOptionsNow(pool cuda.MemPool, maxSize uint64) memory.StackOptions {
	return memory.StackOptions{Strategy: d.Strategy(), Track: d.Memory().Tracking(), Pool: pool, PoolMaxSize: maxSize}
}

func (sp *SharedPool) describe() string {
	if sp.UseDefault {
		return "the device's default pool"
	}
	s := "a pool of cudacore's own"
	if sp.MaxSize != 0 {
		s += ", maximum size " + memory.FormatBytes(sp.MaxSize)
	}
	if sp.IPC {
		s += ", IPC handles"
	}
	return s
}

// UnshareProcessPool undoes ShareProcessPool: cudacore's allocator leaves a pool of its own (refused, with nothing
// changed, while it has memory handed out or a stream captures), the device's previous current pool is
// current again if the shared pool still is (another library may have made a third one current since;
// that one stays), a pool of cudacore's own is destroyed (the driver frees it once the other libraries'
// blocks in it are freed) and the default pool gets its release threshold back. It returns the device's
// current pool afterwards.
func (d *Device) UnshareProcessPool() (cuda.MemPool, error) {
	if _, err := d.FlushOrphans(); err != nil {
		return 0, err
	}
	var current cuda.MemPool
	err := captures.Steady(func() error {
		var err error
		current, err = d.unshareProcessPool()
		return err
	})
	return current, err
}

func (d *Device) unshareProcessPool() (cuda.MemPool, error) {
	const op = "cudacore.unshare_pool"
	devMu.Lock()
	defer devMu.Unlock()
	d.inFlight.Lock()
	defer d.inFlight.Unlock()
	sp := d.shared.Load()
	if sp == nil {
		return 0, cuda.NewError(op, cuda.ErrorIllegalState, d.String()+" shares no memory pool")
	}
	drv, ctx, dev := d.Driver(), d.Context(), d.Handle()
	if !sp.UseDefault {
		if err := d.checkReplaceLocked(op, "take the allocator out of the shared pool of"); err != nil {
			return 0, err
		}
		if err := d.replaceStackLocked(d.stackOptionsNow(0, 0)); err != nil {
			return 0, err
		}
	}
	d.shared.Store(nil)
	var errs []error
	cur, err := drv.DeviceGetMemPool(dev)
	if err == nil && cur == sp.Handle {
		if err = drv.DeviceSetMemPool(dev, sp.Previous); cuda.ResultOf(err) == cuda.ErrorInvalidValue {
			// The previous pool was destroyed meanwhile (by its owner): the default pool takes its place.
			var def cuda.MemPool
			if def, err = drv.DeviceDefaultMemPool(dev); err == nil {
				err = drv.DeviceSetMemPool(dev, def)
			}
		}
	}
	errs = append(errs, err)
	if sp.UseDefault {
		errs = append(errs, drv.MemPoolSetAttribute(ctx, sp.Handle, cuda.PoolAttrReleaseThreshold, sp.previousThreshold))
	} else {
		errs = append(errs, drv.MemPoolDestroy(ctx, sp.Handle))
	}
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	return drv.DeviceGetMemPool(dev)
}

// PoolUsage is what the pool of the device's allocator holds now: its use and reserve over every library
// drawing from it (cuMemPoolGetAttribute), and the allocator's own share of the use (memory.Pool.Held).
type PoolUsage struct {
	Handle   cuda.MemPool
	Used     uint64
	Reserved uint64
	Held     uint64
}

// PoolUsage reads the allocator's pool. ok is false on the synchronous strategy (no pool). While a
// stream captures, Used and Reserved are the last readings (a query would invalidate the capture).
func (d *Device) PoolUsage() (PoolUsage, bool, error) {
	d.inFlight.RLock()
	defer d.inFlight.RUnlock()
	p := d.Memory().Pool()
	if p == nil {
		return PoolUsage{}, false, nil
	}
	used, err := p.Used()
	if err != nil {
		return PoolUsage{}, true, err
	}
	reserved, err := p.Reserved()
	if err != nil {
		return PoolUsage{}, true, err
	}
	return PoolUsage{Handle: p.Handle(), Used: used, Reserved: reserved, Held: p.Held()}, true, nil
}

// ExplainOutOfMemory is cudacore's out-of-memory error for an allocation of requested bytes on stream st
// of d that failed in another library of the process (op names it: "torch", "cupy", "rmm"), with the verdict
// memory.OutOfMemory gives from the device's state now: what cudacore's allocator holds, the pool's
// reserve and maximum size, and the bytes the process's other libraries hold in the same pool, which are
// this process's and never blamed on other processes. Nothing is recorded; on the pool
// strategy, with the device's free memory enough for the request, the verdict probes for one block of
// that size outside the pool (allocated and freed at once), as for cudacore's own failures, unless a
// capture runs on st (memory.Stack.StateOn) or on a stream of cudacore's.
func (d *Device) ExplainOutOfMemory(requested uint64, st cuda.Stream, op string) *cuda.Error {
	d.inFlight.RLock()
	defer d.inFlight.RUnlock()
	return memory.OutOfMemory(d.Device, requested, cuda.NewError(op, cuda.ErrorOutOfMemory, ""), d.Memory().StateOn(st))
}
