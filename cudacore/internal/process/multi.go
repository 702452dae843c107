package process

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sync"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/device"
	"github.com/cudacore/cudacore/pkg/stream"
)

// Several devices and several processes: peer access, shareable memory and its import.
//
// Shareable memory is separate from the device's allocator (Memory): its blocks must never be cached for
// reuse while another process maps them, so they come straight from the driver. On a device with the pool
// strategy they come from a pool of their own created exportable (POSIX file descriptors), made on first
// use; with the synchronous strategy from cuMemAlloc, whose blocks have cuIpc handles.

// Kinds of shareable memory.
const (
	KindPool = "pool" // an exportable pool's block: a pool descriptor plus export data
	KindIPC  = "ipc"  // a cuMemAlloc block: a cuIpcMemHandle
)

var (
	multiMu    sync.Mutex
	sharePools = map[int]cuda.MemPool{} // ordinal -> the device's exportable pool
	// exportRefused holds, per ordinal, the driver's refusal to export a block of an exportable pool
	// (sharePool's probe): that device shares KindIPC memory only.
	exportRefused = map[int]error{}
	peersOf       = map[int]map[int]bool{}    // ordinal -> devices given access to its memory
	imported      = map[string]cuda.MemPool{} // "ordinal/exporter pool id" -> the pool imported here
)

// CanAccessPeer says whether d can access peer's memory directly.
func (d *Device) CanAccessPeer(peer *Device) (bool, error) {
	return d.Driver().DeviceCanAccessPeer(d.Handle(), peer.Handle())
}

// EnablePeerAccess lets d access peer's memory: the context's peer access, and read-write access to
// peer's memory pools (its allocator's and its exportable pool), which peer access does not cover. It is
// idempotent; pools peer makes later are opened to d as they are made.
func (d *Device) EnablePeerAccess(peer *Device) error {
	const op = "cudacore.enable_peer_access"
	if d == peer {
		return cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf("%s is itself; peer access is between two devices", d))
	}
	can, err := d.CanAccessPeer(peer)
	if err != nil {
		return err
	}
	if !can {
		return cuda.NewError(op, cuda.ErrorPeerAccessUnsupported, fmt.Sprintf(
			"%s cannot access %s's memory directly (see Device.can_access_peer); copies between them still work, staged through the host", d, peer))
	}
	drv := d.Driver()
	if err := drv.CtxEnablePeerAccess(d.Context(), peer.Context()); err != nil && cuda.ResultOf(err) != cuda.ErrorPeerAccessAlreadyEnabled {
		return err
	}
	multiMu.Lock()
	defer multiMu.Unlock()
	if peersOf[peer.Ordinal()] == nil {
		peersOf[peer.Ordinal()] = map[int]bool{}
	}
	peersOf[peer.Ordinal()][d.Ordinal()] = true
	for _, pool := range peer.poolsLocked() {
		if err := drv.MemPoolSetAccess(peer.Context(), pool, d.Handle(), cuda.AccessReadWrite); err != nil {
			return err
		}
	}
	return nil
}

// libraryDevices are the devices that other libraries allocated on through cudacore's allocators
// (LibraryAllocates), in the order they first did; libMu guards it and is taken before multiMu.
var (
	libMu          sync.Mutex
	libraryDevices []*Device
)

// LibraryAllocates is called by the allocators cudacore hands other libraries (CuPy's, PyTorch's, Numba's)
// as they allocate on d, on stream (0: not known). Those libraries expect memory as cudaMalloc gives it,
// which a kernel or copy on another device reaches once that device has peer access (they enable it
// themselves before they touch another device's memory); a pool's memory is reached only from devices the
// pool grants access to. So once, d and each device libraries allocated on before get access to each
// other's memory, pools included (EnablePeerAccess both ways), wherever the two can access each other.
//
// The calls are unsafe during a capture, so nothing is done while one of cudacore's runs or while stream
// (the library's own, which cudacore may not know) captures: a later allocation does it. Nor on a stream
// cudacore destroyed, whose handle must not reach the driver. A capture that
// another library began in global mode on another thread is not seen; the first allocation on a device
// rarely falls inside one (a library warms up before it captures). A pair the driver refuses is left as it
// is (its copies are staged by the driver) and not tried again, so that no allocation pays for it twice.
// It says whether d is done.
func (d *Device) LibraryAllocates(stream cuda.Stream) bool {
	if d.library.Load() {
		return true
	}
	_ = captures.Steady(func() error {
		if Capturing() {
			return nil
		}
		if stream != 0 {
			// The handle's use is bracketed as an allocation's (Manager.Use): a stream cudacore destroyed
			// or is closing never reaches the driver (the real driver crashes on a destroyed handle), and
			// nothing is done, the allocation that follows refusing the stream; a live one cannot be
			// destroyed until the check is made.
			streams := d.Streams()
			if err := streams.Use("interop", stream); err != nil {
				return nil
			}
			st, err := d.Driver().StreamIsCapturing(d.Context(), stream)
			streams.Done(stream)
			if err != nil || st != cuda.CaptureStatusNone {
				return nil
			}
		}
		libMu.Lock()
		defer libMu.Unlock()
		if d.library.Load() {
			return nil
		}
		for _, q := range libraryDevices {
			if can, err := d.CanAccessPeer(q); err == nil && can {
				_ = d.EnablePeerAccess(q)
				_ = q.EnablePeerAccess(d)
			}
		}
		libraryDevices = append(libraryDevices, d)
		d.library.Store(true)
		return nil
	})
	return d.library.Load()
}

// PeersWithAccess lists the devices given access to d's memory with EnablePeerAccess.
func (d *Device) PeersWithAccess() []int {
	multiMu.Lock()
	defer multiMu.Unlock()
	var out []int
	for i := range peersOf[d.Ordinal()] {
		out = append(out, i)
	}
	return out
}

// poolsLocked returns the pools of d that peers need access to (multiMu held).
func (d *Device) poolsLocked() []cuda.MemPool {
	var out []cuda.MemPool
	if p := d.Memory().Pool(); p != nil {
		out = append(out, p.Handle())
	}
	if p, ok := sharePools[d.Ordinal()]; ok {
		out = append(out, p)
	}
	return out
}

// ShareKind is the kind of shareable memory d hands out: KindPool on the pool strategy where the driver
// exports a pool's blocks (sharePool's probe; not probed while a stream captures, when no shareable
// memory is made anyway), else KindIPC.
//
// The check and the probe run while no capture can begin or end (Steady): the probe's calls are unsafe
// during a capture and would invalidate one begun on another thread in between.
func (d *Device) ShareKind() string {
	if d.Strategy() != device.StrategyPool {
		return KindIPC
	}
	kind := KindPool
	_ = captures.Steady(func() error {
		if !Capturing() {
			if _, err := d.sharePool(); err != nil && errors.Is(err, cuda.ErrNotSupported) {
				kind = KindIPC
			}
		}
		return nil
	})
	return kind
}

// sharePool returns d's exportable pool, made on first use. A driver that makes the pool but refuses to
// export its blocks (the H100 test machine answers INVALID_VALUE to cuMemPoolExportPointer even in the
// order NVIDIA documents) gives a NotSupported error naming that refusal, for good: d then shares
// KindIPC memory (ShareKind). Other failures are returned as they are and not remembered.
func (d *Device) sharePool() (cuda.MemPool, error) {
	multiMu.Lock()
	defer multiMu.Unlock()
	if p, ok := sharePools[d.Ordinal()]; ok {
		return p, nil
	}
	if err, ok := exportRefused[d.Ordinal()]; ok {
		return 0, err
	}
	drv, ctx := d.Driver(), d.Context()
	p, err := drv.MemPoolCreate(ctx, cuda.PoolProps{Device: d.Handle(), HandleTypes: cuda.HandlePosixFD})
	if err != nil {
		return 0, err
	}
	if refusal, err := probeExport(drv, ctx, p); err != nil || refusal != nil {
		_ = drv.MemPoolDestroy(ctx, p)
		if err != nil {
			return 0, err
		}
		err = refusal
		if r := cuda.ResultOf(err); r == cuda.ErrorInvalidValue || r == cuda.ErrorNotSupported || r == cuda.ErrorNotPermitted {
			refused := cuda.NewError("cudacore.allocate_shareable", cuda.ErrorNotSupported, fmt.Sprintf(
				"%s makes exportable memory pools but its driver refuses to export their blocks (%v): it shares memory of kind %q (cuMemAlloc and cuIpc handles) instead",
				d, err, KindIPC))
			exportRefused[d.Ordinal()] = refused
			return 0, refused
		}
		return 0, err
	}
	// As for the allocator's pool: keep freed memory reserved, so allocation after a synchronize is cheap.
	if err := drv.MemPoolSetAttribute(ctx, p, cuda.PoolAttrReleaseThreshold, math.MaxUint64); err != nil {
		_ = drv.MemPoolDestroy(ctx, p)
		return 0, err
	}
	for peer := range peersOf[d.Ordinal()] {
		pd, err := Lookup(peer)
		if err != nil {
			return 0, err
		}
		if err := drv.MemPoolSetAccess(ctx, p, pd.Handle(), cuda.AccessReadWrite); err != nil {
			_ = drv.MemPoolDestroy(ctx, p)
			return 0, err
		}
	}
	sharePools[d.Ordinal()] = p
	return p, nil
}

// probeExport exports one block of pool p, made and freed on a private stream: whether the driver
// exports this pool's blocks at all. A block exists for export once its stream has reached its allocation.
// refusal is cuMemPoolExportPointer's error; err is that of a step before it (nothing learnt).
func probeExport(drv cuda.Driver, ctx cuda.Context, p cuda.MemPool) (refusal, err error) {
	s, err := drv.StreamCreate(ctx, cuda.StreamNonBlocking, 0)
	if err != nil {
		return nil, err
	}
	defer func() { _ = drv.StreamDestroy(ctx, s) }()
	ptr, err := drv.MemAllocFromPoolAsync(ctx, 1, p, s)
	if err != nil {
		return nil, err
	}
	defer func() {
		_ = drv.MemFreeAsync(ctx, ptr, s)
		_ = drv.StreamSynchronize(ctx, s)
	}()
	if err := drv.StreamSynchronize(ctx, s); err != nil {
		return nil, err
	}
	_, refusal = drv.MemPoolExportPointer(ctx, ptr)
	return refusal, nil
}

func refuseDuringCapture(op string) error {
	if Capturing() {
		return cuda.NewError(op, cuda.ErrorStreamCaptureUnsupported,
			"shareable memory is not allocated, exported or imported while a stream captures; do it before or after the capture")
	}
	return nil
}

// ShareAllocate allocates size bytes of shareable memory on d, ordered on h for the pool kind.
// kind is KindPool, KindIPC, or "" for ShareKind's; KindPool needs a device with memory pools. The
// capture check and the allocation run while no capture can begin or end (Steady): a synchronous
// allocation, and the exportable pool's probe, are unsafe calls during a capture. Out of memory, it
// releases cudacore's caches and retries once (allocOutside).
func (d *Device) ShareAllocate(size uint64, h cuda.Stream, kind string) (cuda.DevicePtr, error) {
	if kind == "" {
		kind = d.ShareKind()
	}
	return d.allocOutside(size, func() (p cuda.DevicePtr, err error) {
		err = captures.Steady(func() error {
			p, err = d.shareAllocate(size, h, kind)
			return err
		})
		return p, err
	})
}

func (d *Device) shareAllocate(size uint64, h cuda.Stream, kind string) (cuda.DevicePtr, error) {
	const op = "cudacore.allocate_shareable"
	if err := refuseDuringCapture(op); err != nil {
		return 0, err
	}
	drv, ctx := d.Driver(), d.Context()
	switch kind {
	case KindIPC:
		p, err := drv.MemAlloc(ctx, size)
		if err == nil {
			d.Streams().Reissued(p)
		}
		return p, err
	case KindPool:
		if !d.Properties().MemoryPoolsSupported {
			return 0, cuda.NewError(op, cuda.ErrorNotSupported, fmt.Sprintf(
				"%s has no memory pools, so no exportable pool: use kind %q (cuIpc handles)", d, KindIPC))
		}
	default:
		return 0, cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf("unknown kind of shared memory %q: want %q or %q", kind, KindPool, KindIPC))
	}
	pool, err := d.sharePool()
	if err != nil {
		return 0, err
	}
	streams := d.Streams()
	if err := streams.UseForAlloc(h); err != nil {
		return 0, err
	}
	defer streams.Done(h)
	p, err := drv.MemAllocFromPoolAsync(ctx, size, pool, h)
	if err == nil {
		streams.Reissued(p)
	}
	return p, err
}

// ShareFreeHeld is ShareFree for the size bytes at p that live graphs may use: while one does (a copy or a
// kernel it captured names them), the free waits for the destruction of every such graph, as the free
// of a Buffer does, so that no launch writes into memory handed out again.
//
// During a capture, which may name the memory, the whole decision waits for the captures to end and their
// graphs to take their uses (the deferred calls run then): made now, a capture's graph would not be among
// the users yet, and the free would come before the graph's launches.
func (d *Device) ShareFreeHeld(p cuda.DevicePtr, size uint64, kind string, h cuda.Stream) error {
	return steadyOrDefer(func(later bool) error {
		if later {
			h = stream.Later(h)
		}
		held, err := d.Streams().FreeGraphAware(p, size, func() error { return d.shareFreeNow(p, kind, h) },
			func() { _ = d.ShareFree(p, kind, stream.Later(h)) })
		if held {
			return err
		}
		return d.shareFreeNow(p, kind, h)
	})
}

// ShareFree frees what ShareAllocate returned, in order on h for the pool kind. While a stream captures
// the free waits for the capture to end, as every free does.
func (d *Device) ShareFree(p cuda.DevicePtr, kind string, h cuda.Stream) error {
	// The call runs without the GIL: the check and the free are made while no capture can begin
	// (steadyOrDefer), so that a GLOBAL capture begun on another thread in between is not invalidated.
	return steadyOrDefer(func(later bool) error {
		if later {
			return d.shareFreeNow(p, kind, stream.Later(h))
		}
		return d.shareFreeNow(p, kind, h)
	})
}

// shareFreeNow makes ShareFree's driver call, where no capture is in progress and none can begin.
func (d *Device) shareFreeNow(p cuda.DevicePtr, kind string, h cuda.Stream) error {
	drv, ctx := d.Driver(), d.Context()
	if kind == KindIPC {
		return drv.MemFree(ctx, p)
	}
	streams := d.Streams()
	use := streams.UseForFree(h)
	defer streams.Done(h)
	return drv.MemFreeAsync(ctx, p, use)
}

// Export is what another process needs to open shareable memory.
type Export struct {
	Kind   string         `json:"kind"`
	Handle cuda.IpcHandle `json:"-"`
	// FD is a new descriptor of the exportable pool (KindPool), owned by the caller: send it to the other
	// process (SCM_RIGHTS) and close it here.
	FD     int    `json:"fd"`
	PoolID string `json:"pool_id"`
}

// ShareExport exports shareable memory at p of kind.
func (d *Device) ShareExport(p cuda.DevicePtr, kind string) (Export, error) {
	const op = "cudacore.export"
	if err := refuseDuringCapture(op); err != nil {
		return Export{}, err
	}
	drv, ctx := d.Driver(), d.Context()
	if kind == KindIPC {
		h, err := drv.IpcGetMemHandle(ctx, p)
		return Export{Kind: KindIPC, Handle: h, FD: -1}, err
	}
	multiMu.Lock()
	pool, ok := sharePools[d.Ordinal()]
	multiMu.Unlock()
	if !ok {
		return Export{}, cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf("%s has no exportable pool: the memory is not shareable", d))
	}
	data, err := drv.MemPoolExportPointer(ctx, p)
	if err != nil {
		return Export{}, err
	}
	fd, err := drv.MemPoolExportToShareableHandle(ctx, pool, cuda.HandlePosixFD)
	if err != nil {
		return Export{}, err
	}
	return Export{Kind: KindPool, Handle: data, FD: fd, PoolID: fmt.Sprintf("%d:%d:%#x", os.Getpid(), d.Ordinal(), uint64(pool))}, nil
}

// ShareImport opens memory another process exported: for KindPool, fd is the pool's descriptor (read
// only when this process has not imported that pool yet; the caller keeps it and closes it).
func (d *Device) ShareImport(kind string, h cuda.IpcHandle, fd int, poolID string) (cuda.DevicePtr, error) {
	const op = "cudacore.open_shared"
	if err := refuseDuringCapture(op); err != nil {
		return 0, err
	}
	drv, ctx := d.Driver(), d.Context()
	switch kind {
	case KindIPC:
		return drv.IpcOpenMemHandle(ctx, h)
	case KindPool:
	default:
		return 0, cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf("unknown kind of shared memory %q: want %q or %q", kind, KindPool, KindIPC))
	}
	key := fmt.Sprintf("%d/%s", d.Ordinal(), poolID)
	multiMu.Lock()
	pool, ok := imported[key]
	if !ok {
		if fd < 0 {
			multiMu.Unlock()
			return 0, cuda.NewError(op, cuda.ErrorInvalidValue, "the pool's file descriptor did not arrive with the handle")
		}
		var err error
		if pool, err = drv.MemPoolImportFromShareableHandle(ctx, fd, cuda.HandlePosixFD); err != nil {
			multiMu.Unlock()
			return 0, err
		}
		imported[key] = pool
	}
	multiMu.Unlock()
	return drv.MemPoolImportPointer(ctx, pool, h)
}

// ShareClose unmaps memory ShareImport opened.
// While a stream captures, the unmapping waits for the capture to end (it could be an unsafe call).
func (d *Device) ShareClose(p cuda.DevicePtr, kind string) error {
	closeNow := func() error {
		drv, ctx := d.Driver(), d.Context()
		if kind == KindIPC {
			return drv.IpcCloseMemHandle(ctx, p)
		}
		return drv.MemFree(ctx, p)
	}
	return steadyOrDefer(func(bool) error { return closeNow() }) // without the GIL, as ShareFree
}

// ProbeIPC tries each way of sharing memory and events with another process on d, exporting only, and
// says for each "ok" or why not. It makes and frees what it exports; the exportable pool it may create
// stays, as it would for the first shareable allocation.
func ProbeIPC(d *Device) map[string]string {
	drv, ctx := d.Driver(), d.Context()
	out := map[string]string{}
	say := func(key string, err error) {
		if err != nil {
			out[key] = err.Error()
		} else {
			out[key] = "ok"
		}
	}
	if d.Properties().MemoryPoolsSupported {
		say("posix_fd", func() error {
			pool, err := d.sharePool()
			if err != nil {
				return err
			}
			fd, err := drv.MemPoolExportToShareableHandle(ctx, pool, cuda.HandlePosixFD)
			if err == nil {
				closeFD(fd)
			}
			return err
		}())
	} else {
		say("posix_fd", cuda.NewError("cuMemPoolCreate", cuda.ErrorNotSupported, d.String()+" has no memory pools"))
	}
	say("cuipc_mem", func() error {
		p, err := drv.MemAlloc(ctx, 1)
		if err != nil {
			return err
		}
		_, err = drv.IpcGetMemHandle(ctx, p)
		if ferr := drv.MemFree(ctx, p); err == nil {
			err = ferr
		}
		return err
	}())
	say("cuipc_event", func() error {
		e, err := drv.EventCreate(ctx, cuda.EventInterprocess|cuda.EventDisableTiming)
		if err != nil {
			return err
		}
		_, err = drv.IpcGetEventHandle(ctx, e)
		if derr := drv.EventDestroy(ctx, e); err == nil {
			err = derr
		}
		return err
	}())
	return out
}

// regrantPeersLocked opens d's allocator pool, new after a strategy switch, to the devices that were
// given access to d's memory (EnablePeerAccess). The caller holds devMu, so peers are read from devices,
// and multiMu.
func (d *Device) regrantPeersLocked() error {
	pool := d.Memory().Pool()
	if pool == nil {
		return nil
	}
	for ordinal := range peersOf[d.Ordinal()] {
		peer, ok := devices[ordinal]
		if !ok {
			continue
		}
		if err := d.Driver().MemPoolSetAccess(d.Context(), pool.Handle(), peer.Handle(), cuda.AccessReadWrite); err != nil {
			return err
		}
	}
	return nil
}

// ShareRelease trims d's exportable pool to nothing (cuMemPoolTrimTo), if it has one.
func (d *Device) ShareRelease() error {
	multiMu.Lock()
	pool, ok := sharePools[d.Ordinal()]
	multiMu.Unlock()
	if !ok {
		return nil
	}
	return d.Driver().MemPoolTrimTo(d.Context(), pool, 0)
}
