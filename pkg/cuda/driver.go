package cuda

import "fmt"

// Handles. Their values are the driver's own handles (pointers or ordinals) for the real driver and
// opaque numbers for the simulator; only the Driver that made one may interpret it.
type (
	Device    int32   // CUdevice
	Context   uintptr // CUcontext (cudacore only uses primary contexts)
	Stream    uintptr // CUstream; see StreamLegacy and StreamPerThread
	Event     uintptr // CUevent
	Graph     uintptr // CUgraph
	GraphExec uintptr // CUgraphExec
	MemPool   uintptr // CUmemoryPool
	Module    uintptr // CUmodule
	Function  uintptr // CUfunction
	DevicePtr uint64  // CUdeviceptr
)

// The special stream handles of the driver API.
const (
	StreamLegacy    Stream = 0x1 // CU_STREAM_LEGACY; the 0 handle means the same
	StreamPerThread Stream = 0x2 // CU_STREAM_PER_THREAD
)

// Stream creation flags (CU_STREAM_*).
const (
	StreamDefault     uint32 = 0x0
	StreamNonBlocking uint32 = 0x1
)

// Event creation flags (CU_EVENT_*).
const (
	EventDefault       uint32 = 0x0
	EventBlockingSync  uint32 = 0x1
	EventDisableTiming uint32 = 0x2
)

// Host allocation flags (CU_MEMHOSTALLOC_*) and the managed attach flag.
const (
	HostAllocPortable      uint32 = 0x1
	HostAllocDeviceMap     uint32 = 0x2
	HostAllocWriteCombined uint32 = 0x4
	MemAttachGlobal        uint32 = 0x1
)

// CPU is the device number of the host in the managed-memory calls (CU_DEVICE_CPU).
const CPU = -1

// MemAdvice is a CUmem_advise: a hint about how managed memory is used.
type MemAdvice int

const (
	AdviseSetReadMostly          MemAdvice = 1
	AdviseUnsetReadMostly        MemAdvice = 2
	AdviseSetPreferredLocation   MemAdvice = 3
	AdviseUnsetPreferredLocation MemAdvice = 4
	AdviseSetAccessedBy          MemAdvice = 5
	AdviseUnsetAccessedBy        MemAdvice = 6
)

// DeviceAttribute is a CUdevice_attribute. Only the attributes cudacore reads are named here.
type DeviceAttribute int32

const (
	AttrMaxThreadsPerBlock           DeviceAttribute = 1
	AttrMaxBlockDimX                 DeviceAttribute = 2
	AttrMaxBlockDimY                 DeviceAttribute = 3
	AttrMaxBlockDimZ                 DeviceAttribute = 4
	AttrMaxGridDimX                  DeviceAttribute = 5
	AttrMaxGridDimY                  DeviceAttribute = 6
	AttrMaxGridDimZ                  DeviceAttribute = 7
	AttrMaxSharedMemoryPerBlock      DeviceAttribute = 8
	AttrWarpSize                     DeviceAttribute = 10
	AttrMaxRegistersPerBlock         DeviceAttribute = 12
	AttrMultiprocessorCount          DeviceAttribute = 16
	AttrIntegrated                   DeviceAttribute = 18
	AttrCanMapHostMemory             DeviceAttribute = 19
	AttrPCIBusID                     DeviceAttribute = 33
	AttrPCIDeviceID                  DeviceAttribute = 34
	AttrTCCDriver                    DeviceAttribute = 35
	AttrL2CacheSize                  DeviceAttribute = 38
	AttrMaxThreadsPerMultiprocessor  DeviceAttribute = 39
	AttrUnifiedAddressing            DeviceAttribute = 41
	AttrPCIDomainID                  DeviceAttribute = 50
	AttrComputeCapabilityMajor       DeviceAttribute = 75
	AttrComputeCapabilityMinor       DeviceAttribute = 76
	AttrStreamPrioritiesSupported    DeviceAttribute = 78
	AttrManagedMemory                DeviceAttribute = 83
	AttrMaxSharedMemoryPerBlockOptin DeviceAttribute = 97
	AttrHostRegisterSupported        DeviceAttribute = 99
	AttrMaxPersistingL2CacheSize     DeviceAttribute = 108
	AttrMemoryPoolsSupported         DeviceAttribute = 115
)

// Limit is a CUlimit, set with cuCtxSetLimit on a context.
type Limit int32

const (
	LimitStackSize                    Limit = 0
	LimitPrintfFIFOSize               Limit = 1
	LimitMallocHeapSize               Limit = 2
	LimitDevRuntimeSyncDepth          Limit = 3
	LimitDevRuntimePendingLaunchCount Limit = 4
	LimitMaxL2FetchGranularity        Limit = 5
	LimitPersistingL2CacheSize        Limit = 6
)

// MemPoolAttribute is a CUmemPool_attribute; cudacore uses the 64-bit ones.
type MemPoolAttribute int32

const (
	PoolAttrReleaseThreshold   MemPoolAttribute = 4
	PoolAttrReservedMemCurrent MemPoolAttribute = 5
	PoolAttrReservedMemHigh    MemPoolAttribute = 6
	PoolAttrUsedMemCurrent     MemPoolAttribute = 7
	PoolAttrUsedMemHigh        MemPoolAttribute = 8
)

// PoolProps are what cudacore sets of a CUmemPoolProps: a pool of pinned memory located on Device.
type PoolProps struct {
	Device Device
	// HandleTypes is HandleNone, or HandlePosixFD for a pool whose memory other processes can import
	// (MemPoolExportToShareableHandle).
	HandleTypes HandleType
	// MaxSize caps what the pool may reserve from the device, in bytes; 0 leaves the driver's default (no
	// cap below the device's memory). The field exists from CUDA 12.2 (PoolMaxSizeVersion): an older
	// driver is refused ErrorNotSupported before it is called.
	MaxSize uint64
}

// PoolMaxSizeVersion is the first driver version (CUDA 12.2) whose CUmemPoolProps has maxSize; to older
// drivers those bytes are reserved and must be zero.
const PoolMaxSizeVersion = 12020

// MaxSizeUnsupported is the error of a pool with a maximum size asked of a driver of version (as
// Version returns it) older than PoolMaxSizeVersion, made before that driver is called.
func MaxSizeUnsupported(op string, version int) *Error {
	return NewError(op, ErrorNotSupported, fmt.Sprintf(
		"a memory pool's maximum size needs a driver for CUDA 12.2 or newer; this one is CUDA %d.%d",
		version/1000, version%1000/10))
}

// CaptureMode is a CUstreamCaptureMode.
type CaptureMode int32

const (
	CaptureModeGlobal      CaptureMode = 0
	CaptureModeThreadLocal CaptureMode = 1
	CaptureModeRelaxed     CaptureMode = 2
)

// CaptureStatus is a CUstreamCaptureStatus.
type CaptureStatus int32

const (
	CaptureStatusNone        CaptureStatus = 0
	CaptureStatusActive      CaptureStatus = 1
	CaptureStatusInvalidated CaptureStatus = 2
)

// FunctionAttribute is a CUfunction_attribute.
type FunctionAttribute int32

const (
	FuncAttrMaxThreadsPerBlock        FunctionAttribute = 0
	FuncAttrSharedSizeBytes           FunctionAttribute = 1
	FuncAttrConstSizeBytes            FunctionAttribute = 2
	FuncAttrLocalSizeBytes            FunctionAttribute = 3
	FuncAttrNumRegs                   FunctionAttribute = 4
	FuncAttrPTXVersion                FunctionAttribute = 5
	FuncAttrBinaryVersion             FunctionAttribute = 6
	FuncAttrMaxDynamicSharedSizeBytes FunctionAttribute = 8
)

// Dim3 is a grid or block shape.
type Dim3 [3]uint32

// Driver is the CUDA driver API as cudacore uses it: only the entry points the project calls, each a
// direct counterpart of one cu* function (named in its comment). Every method returns an error that is an
// *Error (or wraps one) naming that entry point, so callers can match it with errors.Is.
//
// Context-scoped calls take the Context explicitly. The implementation makes it current on the calling OS
// thread for the duration of the call (CUDA contexts are per thread, and a Python thread calling in may
// be new), so callers never juggle cuCtxSetCurrent and goroutines need not lock their threads.
//
// Host memory is passed as []byte. The caller owns it and must keep it alive and unmoved until the
// operation completes: for asynchronous copies, until the stream has passed the copy. Only pinned memory
// (from MemHostAlloc) makes an asynchronous copy truly asynchronous; the driver stages pageable memory
// before returning.
//
// A Driver is safe for use from many goroutines at once.
type Driver interface {
	// Init initializes the driver (cuInit). It is idempotent; every other method requires it.
	Init() error
	// Version returns the driver's CUDA version, 1000*major + 10*minor (cuDriverGetVersion).
	Version() (int, error)

	DeviceCount() (int, error)                            // cuDeviceGetCount
	DeviceGet(ordinal int) (Device, error)                // cuDeviceGet
	DeviceName(Device) (string, error)                    // cuDeviceGetName
	DeviceUUID(Device) ([16]byte, error)                  // cuDeviceGetUuid_v2
	DevicePCIBusID(Device) (string, error)                // cuDeviceGetPCIBusId
	DeviceAttribute(Device, DeviceAttribute) (int, error) // cuDeviceGetAttribute
	DeviceTotalMem(Device) (uint64, error)                // cuDeviceTotalMem_v2
	DeviceDefaultMemPool(Device) (MemPool, error)         // cuDeviceGetDefaultMemPool
	PrimaryCtxRetain(Device) (Context, error)             // cuDevicePrimaryCtxRetain
	PrimaryCtxRelease(Device) error                       // cuDevicePrimaryCtxRelease_v2
	CtxSynchronize(Context) error                         // cuCtxSynchronize
	CtxSetLimit(Context, Limit, uint64) error             // cuCtxSetLimit
	CtxGetLimit(Context, Limit) (uint64, error)           // cuCtxGetLimit
	MemGetInfo(Context) (free, total uint64, err error)   // cuMemGetInfo_v2

	MemAlloc(Context, uint64) (DevicePtr, error)                               // cuMemAlloc_v2
	MemFree(Context, DevicePtr) error                                          // cuMemFree_v2
	MemAllocManaged(Context, uint64, uint32) (DevicePtr, error)                // cuMemAllocManaged
	MemPrefetchAsync(Context, DevicePtr, uint64, int, Stream) error            // cuMemPrefetchAsync (dst: ordinal or CPU)
	MemAdvise(Context, DevicePtr, uint64, MemAdvice, int) error                // cuMemAdvise (device: ordinal or CPU)
	MemAllocAsync(Context, uint64, Stream) (DevicePtr, error)                  // cuMemAllocAsync
	MemAllocFromPoolAsync(Context, uint64, MemPool, Stream) (DevicePtr, error) // cuMemAllocFromPoolAsync
	MemFreeAsync(Context, DevicePtr, Stream) error                             // cuMemFreeAsync
	MemPoolCreate(Context, PoolProps) (MemPool, error)                         // cuMemPoolCreate (device-located, pinned)
	MemPoolDestroy(Context, MemPool) error                                     // cuMemPoolDestroy
	MemPoolSetAttribute(Context, MemPool, MemPoolAttribute, uint64) error      // cuMemPoolSetAttribute
	MemPoolGetAttribute(Context, MemPool, MemPoolAttribute) (uint64, error)    // cuMemPoolGetAttribute
	MemPoolTrimTo(Context, MemPool, uint64) error                              // cuMemPoolTrimTo
	// DeviceGetMemPool returns the device's current pool (cuDeviceGetMemPool): the one cuMemAllocAsync,
	// and so the CUDA runtime's cudaMallocAsync, allocates from. It is the default pool until
	// DeviceSetMemPool names another, and again once that pool is destroyed.
	DeviceGetMemPool(Device) (MemPool, error)
	// DeviceSetMemPool makes pool the device's current pool (cuDeviceSetMemPool), for every context and
	// library of the process. The pool must be located on the device and not imported from another
	// process: anything else is ErrorInvalidValue.
	DeviceSetMemPool(Device, MemPool) error
	// MemHostAlloc returns pinned host memory (cuMemHostAlloc); free it with MemFreeHost, never otherwise.
	MemHostAlloc(Context, uint64, uint32) ([]byte, error)
	MemFreeHost(Context, []byte) error // cuMemFreeHost

	MemcpyHtoD(Context, DevicePtr, []byte) error                         // cuMemcpyHtoD_v2
	MemcpyDtoH(Context, []byte, DevicePtr) error                         // cuMemcpyDtoH_v2
	MemcpyDtoD(Context, DevicePtr, DevicePtr, uint64) error              // cuMemcpyDtoD_v2
	MemcpyHtoDAsync(Context, DevicePtr, []byte, Stream) error            // cuMemcpyHtoDAsync_v2
	MemcpyDtoHAsync(Context, []byte, DevicePtr, Stream) error            // cuMemcpyDtoHAsync_v2
	MemcpyDtoDAsync(Context, DevicePtr, DevicePtr, uint64, Stream) error // cuMemcpyDtoDAsync_v2
	MemsetD8Async(Context, DevicePtr, uint8, uint64, Stream) error       // cuMemsetD8Async

	StreamCreate(Context, uint32, int) (Stream, error)               // cuStreamCreateWithPriority
	StreamDestroy(Context, Stream) error                             // cuStreamDestroy_v2
	StreamSynchronize(Context, Stream) error                         // cuStreamSynchronize
	StreamQuery(Context, Stream) error                               // cuStreamQuery: nil, or ErrorNotReady
	StreamWaitEvent(Context, Stream, Event) error                    // cuStreamWaitEvent
	StreamBeginCapture(Context, Stream, CaptureMode) error           // cuStreamBeginCapture_v2
	StreamEndCapture(Context, Stream) (Graph, error)                 // cuStreamEndCapture
	StreamIsCapturing(Context, Stream) (CaptureStatus, error)        // cuStreamIsCapturing
	CtxStreamPriorityRange(Context) (least, greatest int, err error) // cuCtxGetStreamPriorityRange

	EventCreate(Context, uint32) (Event, error)              // cuEventCreate
	EventDestroy(Context, Event) error                       // cuEventDestroy_v2
	EventRecord(Context, Event, Stream) error                // cuEventRecord
	EventQuery(Context, Event) error                         // cuEventQuery: nil, or ErrorNotReady
	EventSynchronize(Context, Event) error                   // cuEventSynchronize
	EventElapsedTime(Context, Event, Event) (float32, error) // cuEventElapsedTime_v2, milliseconds

	GraphInstantiate(Context, Graph) (GraphExec, error) // cuGraphInstantiateWithFlags
	GraphUpload(Context, GraphExec, Stream) error       // cuGraphUpload
	GraphLaunch(Context, GraphExec, Stream) error       // cuGraphLaunch
	GraphExecUpdate(Context, GraphExec, Graph) error    // cuGraphExecUpdate_v2
	GraphExecDestroy(Context, GraphExec) error          // cuGraphExecDestroy
	GraphDestroy(Context, Graph) error                  // cuGraphDestroy
	GraphNodeCount(Context, Graph) (int, error)         // cuGraphGetNodes (count only)
	DeviceGraphMemTrim(Context, Device) error           // cuDeviceGraphMemTrim: give back graph memory not in use
	// GraphDebugDot writes g as a Graphviz DOT file at path (cuGraphDebugDotPrint); verbose adds every
	// node's parameters. The driver opens and writes the file itself.
	GraphDebugDot(ctx Context, g Graph, path string, verbose bool) error

	ModuleLoadData(Context, []byte) (Module, error)                     // cuModuleLoadData
	ModuleUnload(Context, Module) error                                 // cuModuleUnload
	ModuleGetFunction(Context, Module, string) (Function, error)        // cuModuleGetFunction
	FuncGetAttribute(Context, Function, FunctionAttribute) (int, error) // cuFuncGetAttribute
	// LaunchKernel launches f (cuLaunchKernel). params holds each kernel argument's bytes in order; the
	// driver copies them before returning.
	LaunchKernel(ctx Context, f Function, grid, block Dim3, sharedMem uint32, s Stream, params [][]byte) error

	MultiDriver // peer access, shared pools and IPC (multi.go)
}
