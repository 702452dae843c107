// Package process holds cudacore's process-wide state: the driver chosen for this process and the
// devices opened on it. The facade (package cudacore), whose doors the C fast path calls too, reaches the
// devices through here, so there is exactly one of each per process.
//
// The driver is chosen once, on first use, from CUDACORE_BACKEND ("cuda", the default, or "sim"); a
// failure to load it is remembered and returned to every later caller, so a process without a driver
// gets the same clear error each time rather than a retry storm of dlopen calls. A failure of cuInit
// is not remembered: the next call initializes again.
package process

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cudacore/cudacore/cudacore/internal/snapshot"
	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cuda/libcuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
	"github.com/cudacore/cudacore/pkg/device"
	"github.com/cudacore/cudacore/pkg/memory"
	"github.com/cudacore/cudacore/pkg/stream"
)

// Backend names accepted in CUDACORE_BACKEND.
const (
	BackendCUDA = "cuda"
	BackendSim  = "sim"
)

var (
	driverMu    sync.Mutex
	driverReady atomic.Bool // set once drv is loaded and initialized; then Driver takes no lock
	drv         cuda.Driver
	backend     string
	driverErr   error // a failure to load the driver (no library, a bad backend name or configuration)

	devMu   sync.Mutex
	devices = map[int]*Device{}
	// opened is devices for lock-free lookup on the hot path: an ordinal's slot is written once, under
	// devMu, when the device opens, and never changes after.
	opened [maxFastDevices]atomic.Pointer[Device]
	// openedBound is one more than the highest ordinal in opened (written under devMu).
	openedBound atomic.Int32
)

// maxFastDevices bounds the lock-free table; devices beyond it still work through the map.
const maxFastDevices = 64

// Device is one open device with everything cudacore keeps for it.
type Device struct {
	*device.Device
	// Memory is the device's allocator (strategy base, cache, retry, limit, statistics); see
	// pkg/memory.Stack. It is replaced only by SetStrategy, while nothing is allocated.
	memory atomic.Pointer[memory.Stack]
	// streams caches Streams(): the device's stream manager, set once.
	streams atomic.Pointer[stream.Manager]
	// inFlight is held for reading by every allocation and free, and for writing by SetStrategy: an
	// allocator is replaced only between calls, so a block is always freed through the allocator that
	// made it (a switch racing an allocation once freed a block through the new one).
	//
	// Lock order: the capture registry's change lock (Steady; held for writing while a capture begins or
	// ends, and so by the frees deferred until the captures end), then inFlight, then a stream's lifetime
	// (Manager.Use and UseForFree), then the capture registry's mutex. Allocate takes the registry's mutex
	// while it holds inFlight (CheckAllocate, NoteAllocate), so nothing that holds the registry's mutex
	// (Registry.RunOrDefer, RunOrDeferUnsafe) may take inFlight: with a writer of inFlight waiting, the
	// two would deadlock. Calls that a capture forbids and that take inFlight wait for the captures with
	// steadyOrDefer instead.
	inFlight sync.RWMutex
	// managed holds the device's managed (unified) memory allocations (managed.go).
	managed managedTable
	// pageableDirectMax is its stream manager's PageableDirectMax (CUDACORE_PAGEABLE_DIRECT_MAX).
	pageableDirectMax int
	// orphans holds blocks freed after their foreign stream could no longer be vouched for (foreign.go).
	orphans orphanage
	// shared is the pool the device shares with the other libraries of the process (sharedpool.go), nil
	// while it shares none. Written under devMu with inFlight held for writing.
	shared atomic.Pointer[SharedPool]
	// library is set once another library's allocator has allocated on the device and the device was
	// opened to the others such allocators use (LibraryAllocates).
	library atomic.Bool
}

// Memory returns the device's allocator.
func (d *Device) Memory() *memory.Stack { return d.memory.Load() }

// Lookup returns the open device at ordinal without taking a lock, opening it on first use. It is the
// hot path's way in.
func Lookup(ordinal int) (*Device, error) {
	if ordinal >= 0 && ordinal < maxFastDevices {
		if d := opened[ordinal].Load(); d != nil {
			return d, nil
		}
	}
	return GetDevice(ordinal)
}

// Driver returns the process's driver and its backend name, choosing and initializing it on first use.
func Driver() (cuda.Driver, string, error) {
	if driverReady.Load() {
		return drv, backend, nil
	}
	driverMu.Lock()
	defer driverMu.Unlock()
	if driverReady.Load() {
		return drv, backend, nil
	}
	if driverErr != nil {
		return nil, backend, driverErr
	}
	if drv == nil {
		backend, drv, driverErr = open(getenv("CUDACORE_BACKEND"))
		if driverErr != nil {
			return nil, backend, driverErr
		}
	}
	// A failed cuInit is not remembered: it can be transient, and the next call tries again.
	if err := drv.Init(); err != nil {
		return drv, backend, err
	}
	driverReady.Store(true)
	return drv, backend, nil
}

func open(name string) (string, cuda.Driver, error) {
	switch strings.ToLower(strings.TrimSpace(name)) {
	case "", BackendCUDA:
		d, err := libcuda.Open(getenv("CUDACORE_LIBCUDA"))
		if err != nil {
			return BackendCUDA, nil, err
		}
		return BackendCUDA, d, nil
	case BackendSim:
		d, err := simFromEnv()
		if err != nil {
			return BackendSim, nil, err
		}
		return BackendSim, d, nil
	default:
		return name, nil, cuda.NewError("CUDACORE_BACKEND", cuda.ErrorInvalidValue,
			fmt.Sprintf("unknown backend %q: use \"cuda\" (the real driver, the default) or \"sim\" (the simulator, no GPU needed)", name))
	}
}

// simFromEnv is cudasim.FromEnv reading the live C environment (see getenv).
func simFromEnv() (*cudasim.Driver, error) {
	var opts []cudasim.Option
	if v := strings.TrimSpace(getenv(cudasim.EnvDevices)); v != "" {
		cfgs, err := cudasim.ParseDevices([]byte(v))
		if err != nil {
			return nil, err
		}
		opts = append(opts, cudasim.WithDevices(cfgs...))
	}
	d := cudasim.New(opts...)
	if v := strings.TrimSpace(getenv(cudasim.EnvFaults)); v != "" {
		faults, err := cudasim.ParseFaults(v)
		if err != nil {
			return nil, err
		}
		for _, f := range faults {
			d.InjectDeviceFault(f.Entry, f.Device, f.Nth, f.Code)
		}
	}
	return d, nil
}

// Sim returns the simulator when it is the process's backend, for fault injection from tests.
func Sim() (*cudasim.Driver, error) {
	d, _, err := Driver()
	if err != nil {
		return nil, err
	}
	s, ok := d.(*cudasim.Driver)
	if !ok {
		return nil, cuda.NewError("cudacore.sim", cuda.ErrorNotSupported,
			"fault injection needs the simulator: set CUDACORE_BACKEND=sim before cudacore is first used")
	}
	return s, nil
}

// DeviceCount returns how many devices the driver sees.
func DeviceCount() (int, error) {
	d, _, err := Driver()
	if err != nil {
		return 0, err
	}
	return device.Count(d)
}

// GetDevice returns the open device at ordinal, opening it on first use with the strategy that
// CUDACORE_ALLOCATOR asks for ("auto" when unset).
func GetDevice(ordinal int) (*Device, error) {
	devMu.Lock()
	defer devMu.Unlock()
	if d, ok := devices[ordinal]; ok {
		return d, nil
	}
	drv, _, err := Driver()
	if err != nil {
		return nil, err
	}
	direct, err := pageableDirectMax(getenv(envPageableDirectMax))
	if err != nil {
		return nil, err
	}
	directPath, err := switchOn(envDirect, getenv(envDirect))
	if err != nil {
		return nil, err
	}
	if _, err := switchOn(envRecycle, getenv(envRecycle)); err != nil {
		return nil, err
	}
	dd, err := device.Open(drv, ordinal, getenv("CUDACORE_ALLOCATOR"))
	if err != nil {
		return nil, err
	}
	stack, err := memory.NewStack(dd, stackOptions(dd, memory.StackOptions{}))
	if err != nil {
		_ = dd.Close()
		return nil, err
	}
	d := &Device{Device: dd, pageableDirectMax: direct}
	d.memory.Store(stack)
	d.publish(directPath)
	devices[ordinal] = d
	if ordinal < maxFastDevices {
		opened[ordinal].Store(d)
		if ordinal >= int(openedBound.Load()) {
			openedBound.Store(int32(ordinal + 1))
		}
	}
	return d, nil
}

// SetStrategy rebuilds the device's allocator with another strategy ("auto", "pool" or "sync"). It
// refuses while the current allocator has memory handed out (those pointers belong to it) and while any
// stream of the process captures. The check and the close of the old allocator (which frees its cached
// blocks and synchronizes) run while no capture can begin (Steady): the call releases the GIL, and a
// GLOBAL capture begun on another thread in between was invalidated by those frees, whose blocks were lost.
//
// Orphans (foreign.go) are given back first: the blocks were freed by their owners, and would otherwise
// count as memory still allocated through the current allocator.
func (d *Device) SetStrategy(requested string, opts memory.StackOptions) error {
	if _, err := d.FlushOrphans(); err != nil {
		return err
	}
	return captures.Steady(func() error { return d.setStrategy(requested, opts) })
}

func (d *Device) setStrategy(requested string, opts memory.StackOptions) error {
	devMu.Lock()
	defer devMu.Unlock()
	d.inFlight.Lock()
	defer d.inFlight.Unlock()
	const what = "change the allocation strategy of"
	if err := d.checkReplaceLocked("cudacore.allocation_strategy", what); err != nil {
		return err
	}
	if sp := d.shared.Load(); sp != nil {
		// The allocator stays in the shared pool: a strategy without pools would leave it.
		if s, _, err := device.Choose(d.Properties(), requested); err == nil && s != device.StrategyPool {
			return cuda.NewError("cudacore.allocation_strategy", cuda.ErrorIllegalState, fmt.Sprintf(
				"%s shares memory pool %#x with the other libraries of the process, and the %q strategy allocates outside it: undo the shared pool first",
				d, uint64(sp.Handle), s))
		}
		opts.Pool, opts.PoolMaxSize = sp.Handle, sp.MaxSize
	}
	if err := d.Device.SetStrategy(requested); err != nil {
		return err
	}
	opts.Strategy = d.Strategy()
	return d.replaceStackLocked(opts)
}

// checkReplaceLocked says whether the device's allocator may be replaced now: not while a stream of the
// process captures, nor while the allocator has memory handed out (those pointers belong to it). what
// completes the sentence of the refusal ("change the allocation strategy of" the device).
func (d *Device) checkReplaceLocked(op, what string) error {
	// A capture marks the allocator's cache (memory.Cache.SetCapturing): a new allocator would not know
	// it, would bake cached blocks into the graph, and closing the old one would free or strand blocks
	// that the capture forbids freeing.
	if n := ActiveCaptures(); n > 0 {
		return cuda.NewError(op, cuda.ErrorStreamCaptureUnsupported,
			fmt.Sprintf("cannot %s %s while %d stream capture(s) are in progress; end or abort them first", what, d, n))
	}
	if inUse := d.Memory().Stats().InUse; inUse > 0 {
		return cuda.NewError(op, cuda.ErrorIllegalState,
			fmt.Sprintf("cannot %s %s: it still has %s allocated through the current allocator; close those buffers first",
				what, d, memory.FormatBytes(inUse)))
	}
	return nil
}

// replaceStackLocked makes a new allocator with opts the device's, after checkReplaceLocked passed; the
// caller holds devMu and inFlight for writing, inside captures.Steady.
func (d *Device) replaceStackLocked(opts memory.StackOptions) error {
	old := d.Memory()
	stack, err := memory.NewStack(d.Device, stackOptions(d.Device, opts))
	if err != nil {
		return err
	}
	// The old cache's blocks are freed while it is still the device's allocator: a stream's Destroy
	// gives back that stream's cached blocks through the current allocator (serialized with this release)
	// before the stream goes, so no free here can name a stream destroyed meanwhile. A failure leaves
	// blocks to the Close below, which releases again and reports it.
	_ = old.Release()
	// The new allocator is published and its pool opened to the peers under multiMu, under which
	// EnablePeerAccess reads the pools it grants and grants them: a grant that read the old pool is over
	// before the Close below may destroy it, and one that comes after reads the new pool.
	multiMu.Lock()
	d.memory.Store(stack)
	err = d.regrantPeersLocked()
	multiMu.Unlock()
	snapshot.SetBlocking(d.Ordinal(), d.Strategy() == device.StrategySync)
	if err != nil {
		_ = old.Close()
		return err
	}
	return old.Close()
}

// publish writes the device's facts into the snapshot that the C fast path reads (package snapshot):
// how C reaches its driver (the real driver's entry point table, the simulator's doors, or not at all
// when directPath is false or the driver is another), its context, the largest pageable copy C may hand
// to the driver, and whether its allocator can block.
func (d *Device) publish(directPath bool) {
	f := snapshot.DeviceFacts{Context: uint64(d.Context()), PageableMax: int64(d.Streams().PageableDirectMax()),
		Blocking: d.Strategy() == device.StrategySync}
	if directPath {
		switch drv := d.Driver().(type) {
		case *libcuda.Driver:
			f.Direct, f.Table = snapshot.DirectCUDA, drv.Table()
		case *cudasim.Driver:
			f.Direct = snapshot.DirectSim
		}
	}
	snapshot.SetDevice(d.Ordinal(), f)
}

// stackOptions completes the options of a device's allocator with what the process knows: the pool is
// not queried while a capture runs (memory.WithQuiet), the cache keeps only blocks of streams whose
// destruction cudacore hears of (memory.CacheOptions.Keep: the default streams and its own), and the
// diagnostics (the flight recorder, other processes' memory).
func stackOptions(d *device.Device, opts memory.StackOptions) memory.StackOptions {
	opts.Quiet = Capturing
	// The cache's release frees nothing only where the driver would refuse its frees (900: a GLOBAL
	// capture, or a THREAD_LOCAL one on this thread); during other captures (RELAXED ones, other threads'
	// THREAD_LOCAL ones) it frees the blocks the cache's own rules allow (not those of a capturing stream,
	// nor the legacy stream's while the device captures), so that an out-of-memory retry outside the
	// capture can still make room.
	opts.Cache.Quiet = captures.ForbidsUnsafe
	opts.Cache.Keep = func(h cuda.Stream) bool {
		if stream.IsDefault(h) {
			return true
		}
		_, ok := Streams.Get(int(uint64(h)))
		return ok
	}
	// Out of memory: what this process holds outside the allocator is its own in the verdict, and the
	// retry also gives back what the device's exportable pool keeps cached (closed SharedBuffers' blocks).
	ordinal := d.Properties().Ordinal
	opts.Outside = func() uint64 {
		if pd, err := Lookup(ordinal); err == nil {
			return pd.OutsideInUse()
		}
		return 0
	}
	onOOM := opts.OnOOM
	opts.OnOOM = func(requested uint64) bool {
		if pd, err := Lookup(ordinal); err == nil {
			_ = pd.ShareRelease()
		}
		return onOOM == nil || onOOM(requested)
	}
	return withDiagnostics(d, opts)
}
