// Package cudasim is a simulated CUDA driver: a cuda.Driver over host memory that reproduces the
// behaviour recorded on a real GPU in docs/contributing/driver-facts.md, so that cudacore and its users can run
// their code and tests on a machine with no GPU (CUDACORE_BACKEND=sim).
//
// It models behaviour, not calls: device memory is accounted against each device's total and backed by
// Go byte slices, so copies move real bytes; stream-ordered pools cache freed blocks until a synchronize
// trims them; stream capture follows the driver's state machine and records graphs that replay the
// captured copies with the host data present at launch; limits clamp like the real ones. All work runs
// synchronously at the call, so streams and events are always complete. Device code does not run:
// LaunchKernel returns CUDA_ERROR_NOT_SUPPORTED.
//
// The package owns every handle and device pointer it returns; they mean nothing to another Driver.
// Pinned host memory from MemHostAlloc is anonymous mmap outside the Go heap, owned by the caller until
// MemFreeHost.
package cudasim

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// DefaultDriverVersion is what Version reports unless WithDriverVersion says otherwise (CUDA 13.0, as
// measured).
const DefaultDriverVersion = 13000

// Driver is the simulated driver. It is safe for use from many goroutines at once: each device has its
// own mutex, and the few process-wide tables (captures, pinned memory, faults) have small mutexes that
// are always taken last.
type Driver struct {
	version   int
	devs      []*device
	configErr error // reported by Init: New cannot fail, so a bad config surfaces at the first call
	inited    atomic.Bool
	nextID    atomic.Uint64

	faultMu sync.Mutex
	calls   map[string]int
	faults  map[string][]fault

	capMu sync.Mutex
	caps  map[*capture]struct{} // captures begun and not yet ended, over all devices

	hostMu sync.Mutex
	pinned map[uintptr][]byte // base address of each MemHostAlloc mapping -> the mapping

	fatal func(msg string) // see WithFatal
}

type fault struct {
	at   int // the value calls[key] has when the faulty call is made
	code cuda.Result
}

// faultKey is what faults and calls are kept under: the entry point, or "entry@ordinal" for the calls of
// one device (AnyDevice: every call of the entry point).
func faultKey(entry string, device int) string {
	if device == AnyDevice {
		return entry
	}
	return entry + "@" + strconv.Itoa(device)
}

// Option configures New.
type Option func(*Driver)

// WithDevices sets the simulated devices (default: one H100). Zero fields take the H100 defaults; an
// invalid config makes Init fail with CUDA_ERROR_INVALID_VALUE. An empty list simulates a machine whose
// driver sees no device: Init fails with CUDA_ERROR_NO_DEVICE.
func WithDevices(cfgs ...DeviceConfig) Option {
	return func(d *Driver) {
		d.configErr = nil
		d.devs = nil
		if len(cfgs) > MaxDevices {
			d.configErr = configError("%d devices given; the simulator offers at most %d", len(cfgs), MaxDevices)
			return
		}
		if len(cfgs) == 0 {
			d.configErr = cuda.NewError("cuInit", cuda.ErrorNoDevice, "the simulator was configured with no devices")
			return
		}
		for i, c := range cfgs {
			n, err := normalize(i, c)
			if err != nil {
				d.configErr = err
				d.devs = nil
				return
			}
			d.devs = append(d.devs, newDevice(d, i, n))
		}
	}
}

// WithFatal replaces what the simulator does when it is handed the handle of a stream that was
// destroyed. The real driver segfaults there (seen on the H100), so by default the simulator ends the
// process just as loudly, with a message naming the entry point and the handle, and a CI run on the
// simulator catches any path that lets such a handle through. Tests of the simulator itself pass a
// function that records the message (and panics, to stop the call).
func WithFatal(f func(msg string)) Option { return func(d *Driver) { d.fatal = f } }

func fatalExit(msg string) {
	fmt.Fprintf(os.Stderr, "cudasim: fatal: %s (the real driver crashes the process here)\n", msg)
	os.Exit(139)
}

// WithDriverVersion sets what Version reports (1000*major + 10*minor).
func WithDriverVersion(v int) Option { return func(d *Driver) { d.version = v } }

// New returns a simulator. Call Init before anything else, as with the real driver.
func New(opts ...Option) *Driver {
	d := &Driver{
		version: DefaultDriverVersion,
		calls:   map[string]int{},
		faults:  map[string][]fault{},
		caps:    map[*capture]struct{}{},
		pinned:  map[uintptr][]byte{},
		fatal:   fatalExit,
	}
	WithDevices(H100())(d)
	for _, o := range opts {
		o(d)
	}
	return d
}

// FromEnv returns a simulator configured by CUDACORE_SIM_DEVICES (unset or empty: one H100) and
// CUDACORE_SIM_FAULTS. A malformed value is a *cuda.Error with Result ErrorInvalidValue naming the variable.
func FromEnv() (*Driver, error) {
	var opts []Option
	if v := strings.TrimSpace(os.Getenv(EnvDevices)); v != "" {
		cfgs, err := ParseDevices([]byte(v))
		if err != nil {
			return nil, err
		}
		opts = append(opts, WithDevices(cfgs...))
	}
	d := New(opts...)
	if v := strings.TrimSpace(os.Getenv(EnvFaults)); v != "" {
		fs, err := ParseFaults(v)
		if err != nil {
			return nil, err
		}
		for _, f := range fs {
			d.InjectDeviceFault(f.Entry, f.Device, f.Nth, f.Code)
		}
	}
	return d, nil
}

// AnyDevice is Fault.Device for a fault that counts the calls of its entry point on every device.
const AnyDevice = -1

// Fault is one entry of CUDACORE_SIM_FAULTS.
type Fault struct {
	Entry  string      // a cu* entry point, as named in the cuda.Driver comments
	Nth    int         // 1-based
	Code   cuda.Result // what the call returns
	Device int         // the ordinal whose calls count and fail ("entry@ordinal"), or AnyDevice
}

// deviceless are the entry points whose calls name no device (nor a context of one): a fault of
// theirs cannot be scoped to a device. Calls of the peer entry points name two.
var deviceless = map[string]bool{
	"cuInit": true, "cuDriverGetVersion": true, "cuDeviceGetCount": true, "cuDeviceGet": true,
	"cuCtxEnablePeerAccess": true, "cuMemcpyPeerAsync": true,
}

// ParseFaults parses a CUDACORE_SIM_FAULTS value, "entry[@ordinal]:nth:code[,...]": with @ordinal, nth
// counts only the calls made on that device (through its context, or naming it), and only they fail.
func ParseFaults(s string) ([]Fault, error) {
	bad := func(item, why string) error {
		return cuda.NewError(EnvFaults, cuda.ErrorInvalidValue, fmt.Sprintf(
			"%q: %s; a valid example: cuMemAllocFromPoolAsync:3:2,cuMemAlloc_v2@1:1:CUDA_ERROR_OUT_OF_MEMORY", item, why))
	}
	var out []Fault
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		parts := strings.Split(item, ":")
		if len(parts) != 3 {
			return nil, bad(item, "want entry:nth:code")
		}
		entry, ordinal, scoped := strings.Cut(parts[0], "@")
		if !entryPoints[entry] {
			return nil, bad(item, "unknown entry point "+strconv.Quote(entry))
		}
		device := AnyDevice
		if scoped {
			n, err := strconv.Atoi(ordinal)
			if err != nil || n < 0 {
				return nil, bad(item, "the device after @ must be an ordinal, a whole number from 0")
			}
			if deviceless[entry] {
				return nil, bad(item, entry+"'s calls are not made on one device, so its faults cannot name one")
			}
			device = n
		}
		nth, err := strconv.Atoi(parts[1])
		if err != nil || nth < 1 {
			return nil, bad(item, "nth must be a whole number from 1")
		}
		var code cuda.Result
		if n, err := strconv.ParseInt(parts[2], 10, 32); err == nil {
			code = cuda.Result(n)
		} else if r, ok := cuda.ParseResult(parts[2]); ok {
			code = r
		} else {
			return nil, bad(item, "code must be a CUresult number or name")
		}
		if code == cuda.Success {
			return nil, bad(item, "code 0 is CUDA_SUCCESS, which is not a fault")
		}
		out = append(out, Fault{Entry: entry, Nth: nth, Code: code, Device: device})
	}
	if len(out) == 0 {
		return nil, bad(s, "no faults listed")
	}
	return out, nil
}

// entryPoints are the names Op carries, one per Driver method, exactly as in the cuda.Driver comments.
var entryPoints = map[string]bool{}

func init() {
	for _, n := range strings.Fields(`cuInit cuDriverGetVersion cuDeviceGetCount cuDeviceGet cuDeviceGetName
	cuDeviceGetUuid_v2 cuDeviceGetPCIBusId cuDeviceGetAttribute cuDeviceTotalMem_v2 cuDeviceGetDefaultMemPool
	cuDeviceGetMemPool cuDeviceSetMemPool
	cuDevicePrimaryCtxRetain cuDevicePrimaryCtxRelease_v2 cuCtxSynchronize cuCtxSetLimit cuCtxGetLimit
	cuMemGetInfo_v2 cuMemAlloc_v2 cuMemFree_v2 cuMemAllocManaged cuMemAllocAsync cuMemAllocFromPoolAsync
	cuMemFreeAsync cuMemPoolCreate cuMemPoolDestroy cuMemPoolSetAttribute cuMemPoolGetAttribute cuMemPoolTrimTo
	cuMemHostAlloc cuMemFreeHost cuMemcpyHtoD_v2 cuMemcpyDtoH_v2 cuMemcpyDtoD_v2 cuMemcpyHtoDAsync_v2
	cuMemcpyDtoHAsync_v2 cuMemcpyDtoDAsync_v2 cuMemsetD8Async cuStreamCreateWithPriority cuStreamDestroy_v2
	cuStreamSynchronize cuStreamQuery cuStreamWaitEvent cuStreamBeginCapture_v2 cuStreamEndCapture
	cuStreamIsCapturing cuCtxGetStreamPriorityRange cuEventCreate cuEventDestroy_v2 cuEventRecord
	cuEventQuery cuEventSynchronize cuEventElapsedTime_v2 cuGraphInstantiateWithFlags cuGraphUpload
	cuGraphLaunch cuGraphExecUpdate_v2 cuGraphExecDestroy cuGraphDestroy cuGraphGetNodes cuGraphDebugDotPrint
	cuModuleLoadData
	cuModuleUnload cuModuleGetFunction cuFuncGetAttribute cuLaunchKernel cuDeviceCanAccessPeer
	cuCtxEnablePeerAccess cuMemcpyPeerAsync cuMemPoolSetAccess cuMemPoolGetAccess
	cuMemPoolExportToShareableHandle cuMemPoolImportFromShareableHandle cuMemPoolExportPointer
	cuMemPoolImportPointer cuIpcGetMemHandle cuIpcOpenMemHandle_v2 cuIpcCloseMemHandle cuIpcGetEventHandle
	cuIpcOpenEventHandle cuDeviceGetP2PAttribute cuPointerGetAttribute cuMemRetainAllocationHandle cuMemRelease`) {
		entryPoints[n] = true
	}
}

// InjectFault makes the nth call of entryPoint (1-based, counting from now) fail with code, doing
// nothing else. nth below 1 means the next call.
func (d *Driver) InjectFault(entryPoint string, nth int, code cuda.Result) {
	d.InjectDeviceFault(entryPoint, AnyDevice, nth, code)
}

// InjectDeviceFault is InjectFault counting only the calls of entryPoint made on device (its context,
// or naming it): the nth of those fails, and calls on other devices neither count nor fail. AnyDevice
// counts every call.
func (d *Driver) InjectDeviceFault(entryPoint string, device, nth int, code cuda.Result) {
	if nth < 1 {
		nth = 1
	}
	key := faultKey(entryPoint, device)
	d.faultMu.Lock()
	d.faults[key] = append(d.faults[key], fault{at: d.calls[key] + nth, code: code})
	d.faultMu.Unlock()
}

// ClearFaults drops every pending injected fault and returns how many there were: faults injected
// and not yet reached by a call (a fault sweep uses it to tell a fault that fired from one that did not).
func (d *Driver) ClearFaults() int {
	d.faultMu.Lock()
	n := 0
	for _, fs := range d.faults {
		n += len(fs)
	}
	d.faults = map[string][]fault{}
	d.faultMu.Unlock()
	return n
}

// Calls returns how many times entryPoint has been called, failed calls included.
func (d *Driver) Calls(entryPoint string) int {
	d.faultMu.Lock()
	defer d.faultMu.Unlock()
	return d.calls[entryPoint]
}

// CallCounts returns how many times each entry point has been called so far, failed calls included, by
// name (the calls counted per device are left out): two of them, taken around an operation, show every
// call it made (CallsBetween).
func (d *Driver) CallCounts() map[string]int {
	d.faultMu.Lock()
	defer d.faultMu.Unlock()
	out := make(map[string]int, len(d.calls))
	for k, n := range d.calls {
		if entryPoints[k] {
			out[k] = n
		}
	}
	return out
}

// CallsBetween returns the calls made between two CallCounts, by entry point: those called at least once.
func CallsBetween(before, after map[string]int) map[string]int {
	out := map[string]int{}
	for k, n := range after {
		if n > before[k] {
			out[k] = n - before[k]
		}
	}
	return out
}

// enter counts a call of op and returns its injected fault, if one is due, or NotInitialized.
func (d *Driver) enter(op string) error {
	return d.enterOn(op, AnyDevice)
}

// enterOn is enter for a call made on device index (AnyDevice: on none known): the call counts for op
// and for op on that device, and a fault due for either answers it.
func (d *Driver) enterOn(op string, index int) error {
	d.faultMu.Lock()
	err := d.due(op, op)
	if index != AnyDevice {
		key := faultKey(op, index)
		if err == nil {
			err = d.due(op, key)
		} else {
			d.calls[key]++ // one call, one fault: a fault of this device due now stays pending
		}
	}
	d.faultMu.Unlock()
	if err != nil {
		return err
	}
	if op != "cuInit" && op != "cuDriverGetVersion" && !d.inited.Load() {
		return cuda.NewError(op, cuda.ErrorNotInitialized, "call Init first")
	}
	return nil
}

// due counts a call under key and returns the fault injected under key for this call, if any. Called
// with faultMu held.
func (d *Driver) due(op, key string) error {
	d.calls[key]++
	n := d.calls[key]
	for i, f := range d.faults[key] {
		if f.at == n {
			fs := d.faults[key]
			d.faults[key] = append(fs[:i:i], fs[i+1:]...)
			// Marked, so that whoever reports the failure (the out-of-memory verdict) can say it was injected.
			return cuda.NewError(op, f.code, "fault injected into the simulator", cuda.Field{Key: cuda.FieldInjected, Value: "true"})
		}
	}
	return nil
}

func errf(op string, r cuda.Result, format string, args ...any) error {
	return cuda.NewError(op, r, fmt.Sprintf(format, args...))
}

// Init implements cuInit. With a bad configuration it fails every time, like a driver that cannot start.
func (d *Driver) Init() error {
	if err := d.enter("cuInit"); err != nil {
		return err
	}
	if d.configErr != nil {
		return d.configErr
	}
	d.inited.Store(true)
	return nil
}

// Version implements cuDriverGetVersion, which the real driver answers before cuInit too.
func (d *Driver) Version() (int, error) {
	if err := d.enter("cuDriverGetVersion"); err != nil {
		return 0, err
	}
	return d.version, nil
}

func (d *Driver) DeviceCount() (int, error) {
	if err := d.enter("cuDeviceGetCount"); err != nil {
		return 0, err
	}
	return len(d.devs), nil
}

func (d *Driver) device(op string, dev cuda.Device) (*device, error) {
	index := AnyDevice
	if dev >= 0 && int(dev) < len(d.devs) {
		index = int(dev)
	}
	if err := d.enterOn(op, index); err != nil {
		return nil, err
	}
	if index == AnyDevice {
		return nil, errf(op, cuda.ErrorInvalidDevice, "device %d does not exist; there are %d", dev, len(d.devs))
	}
	return d.devs[dev], nil
}

func (d *Driver) DeviceGet(ordinal int) (cuda.Device, error) {
	const op = "cuDeviceGet"
	if err := d.enter(op); err != nil {
		return 0, err
	}
	if ordinal < 0 || ordinal >= len(d.devs) {
		return 0, errf(op, cuda.ErrorInvalidDevice, "ordinal %d is out of range; there are %d devices", ordinal, len(d.devs))
	}
	return cuda.Device(ordinal), nil
}

func (d *Driver) DeviceName(dev cuda.Device) (string, error) {
	v, err := d.device("cuDeviceGetName", dev)
	if err != nil {
		return "", err
	}
	return v.cfg.Name, nil
}

func (d *Driver) DeviceUUID(dev cuda.Device) ([16]byte, error) {
	v, err := d.device("cuDeviceGetUuid_v2", dev)
	if err != nil {
		return [16]byte{}, err
	}
	return v.cfg.UUID, nil
}

func (d *Driver) DevicePCIBusID(dev cuda.Device) (string, error) {
	v, err := d.device("cuDeviceGetPCIBusId", dev)
	if err != nil {
		return "", err
	}
	return v.cfg.PCIBusID, nil
}

func (d *Driver) DeviceTotalMem(dev cuda.Device) (uint64, error) {
	v, err := d.device("cuDeviceTotalMem_v2", dev)
	if err != nil {
		return 0, err
	}
	return v.cfg.TotalMemory, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// DeviceAttribute implements cuDeviceGetAttribute. Attributes the config does not set have the H100's
// values on every device.
func (d *Driver) DeviceAttribute(dev cuda.Device, a cuda.DeviceAttribute) (int, error) {
	const op = "cuDeviceGetAttribute"
	v, err := d.device(op, dev)
	if err != nil {
		return 0, err
	}
	c := v.cfg
	dom, bus, pdev := pciParts(c.PCIBusID)
	switch a {
	case cuda.AttrMaxThreadsPerBlock, cuda.AttrMaxBlockDimX, cuda.AttrMaxBlockDimY:
		return 1024, nil
	case cuda.AttrMaxBlockDimZ:
		return 64, nil
	case cuda.AttrMaxGridDimX:
		return 2147483647, nil
	case cuda.AttrMaxGridDimY, cuda.AttrMaxGridDimZ:
		return 65535, nil
	case cuda.AttrMaxSharedMemoryPerBlock:
		return 49152, nil
	case cuda.AttrWarpSize:
		return 32, nil
	case cuda.AttrMaxRegistersPerBlock:
		return 65536, nil
	case cuda.AttrMultiprocessorCount:
		return c.MultiprocessorCount, nil
	case cuda.AttrIntegrated:
		return b2i(c.Integrated), nil
	case cuda.AttrCanMapHostMemory, cuda.AttrUnifiedAddressing, cuda.AttrStreamPrioritiesSupported, cuda.AttrHostRegisterSupported:
		return 1, nil
	case cuda.AttrPCIBusID:
		return bus, nil
	case cuda.AttrPCIDeviceID:
		return pdev, nil
	case cuda.AttrPCIDomainID:
		return dom, nil
	case cuda.AttrTCCDriver:
		return b2i(c.TCCDriver), nil
	case cuda.AttrL2CacheSize:
		return 52428800, nil
	case cuda.AttrMaxThreadsPerMultiprocessor:
		return 2048, nil
	case cuda.AttrComputeCapabilityMajor:
		return c.ComputeCapability[0], nil
	case cuda.AttrComputeCapabilityMinor:
		return c.ComputeCapability[1], nil
	case cuda.AttrManagedMemory:
		return b2i(c.ManagedMemory), nil
	case cuda.AttrMaxSharedMemoryPerBlockOptin:
		return 232448, nil
	case cuda.AttrMaxPersistingL2CacheSize:
		return int(v.maxPersistingL2()), nil
	case cuda.AttrMemoryPoolsSupported:
		return b2i(c.MemoryPoolsSupported), nil
	}
	return 0, errf(op, cuda.ErrorInvalidValue, "attribute %d is not one the simulator models", a)
}

func (d *Driver) DeviceDefaultMemPool(dev cuda.Device) (cuda.MemPool, error) {
	const op = "cuDeviceGetDefaultMemPool"
	v, err := d.device(op, dev)
	if err != nil {
		return 0, err
	}
	if !v.cfg.MemoryPoolsSupported {
		return 0, v.noPools(op)
	}
	return v.defaultPool.handle, nil
}

// DeviceGetMemPool implements cuDeviceGetMemPool: the pool cuMemAllocAsync allocates from.
func (d *Driver) DeviceGetMemPool(dev cuda.Device) (cuda.MemPool, error) {
	const op = "cuDeviceGetMemPool"
	v, err := d.device(op, dev)
	if err != nil {
		return 0, err
	}
	if !v.cfg.MemoryPoolsSupported {
		return 0, v.noPools(op)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.current.handle, nil
}

// DeviceSetMemPool implements cuDeviceSetMemPool: the pool must be a live pool located on the device and
// not imported from another process (the driver refuses both with INVALID_VALUE).
func (d *Driver) DeviceSetMemPool(dev cuda.Device, mp cuda.MemPool) error {
	const op = "cuDeviceSetMemPool"
	v, err := d.device(op, dev)
	if err != nil {
		return err
	}
	if !v.cfg.MemoryPoolsSupported {
		return v.noPools(op)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	p := v.pools[mp]
	if p == nil {
		return errf(op, cuda.ErrorInvalidValue, "memory pool %#x is not a live pool located on device %d", uint64(mp), v.index)
	}
	if p.imported {
		return errf(op, cuda.ErrorInvalidValue, "memory pool %#x was imported from another process: it cannot allocate, so it cannot be current", uint64(mp))
	}
	v.current = p
	return nil
}

// Context handles are ctxBase + ordinal*ctxStride: small numbers that no host pointer can be.
const (
	ctxBase   = 0xC7000
	ctxStride = 0x100
)

func (d *Driver) PrimaryCtxRetain(dev cuda.Device) (cuda.Context, error) {
	v, err := d.device("cuDevicePrimaryCtxRetain", dev)
	if err != nil {
		return 0, err
	}
	v.mu.Lock()
	v.ctxRefs++
	v.mu.Unlock()
	return cuda.Context(ctxBase + uintptr(dev)*ctxStride), nil
}

// PrimaryCtxRelease implements cuDevicePrimaryCtxRelease_v2. The last release destroys the context as
// the real driver does: every allocation, stream, event, graph, module and pool of it is gone.
func (d *Driver) PrimaryCtxRelease(dev cuda.Device) error {
	const op = "cuDevicePrimaryCtxRelease_v2"
	v, err := d.device(op, dev)
	if err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.ctxRefs == 0 {
		return errf(op, cuda.ErrorInvalidContext, "the primary context of device %d is not retained", dev)
	}
	v.ctxRefs--
	if v.ctxRefs == 0 {
		v.resetLocked()
	}
	return nil
}

// ctx validates a context, locks its device and returns it; the caller unlocks.
func (d *Driver) ctx(op string, c cuda.Context) (*device, error) {
	u := uintptr(c)
	index := AnyDevice
	if u >= ctxBase && (u-ctxBase)%ctxStride == 0 && int((u-ctxBase)/ctxStride) < len(d.devs) {
		index = int((u - ctxBase) / ctxStride)
	}
	if err := d.enterOn(op, index); err != nil {
		return nil, err
	}
	if index == AnyDevice {
		return nil, errf(op, cuda.ErrorInvalidContext, "context %#x is not one this simulator made", u)
	}
	v := d.devs[index]
	v.mu.Lock()
	if v.ctxRefs == 0 {
		v.mu.Unlock()
		return nil, errf(op, cuda.ErrorInvalidContext, "context %#x was released", u)
	}
	return v, nil
}

func gettid() int { return syscall.Gettid() }

var _ cuda.Driver = (*Driver)(nil)
