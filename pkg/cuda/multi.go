package cuda

// Several devices and several processes: the entry points and types for peer access, memory pools
// shared between devices and processes, and inter-process handles (cuIpc*). They are part of Driver
// through MultiDriver.

// AccessFlags is a CUmemAccess_flags: what a device may do with memory of a pool it does not own.
type AccessFlags int32

const (
	AccessNone      AccessFlags = 0 // CU_MEM_ACCESS_FLAGS_PROT_NONE
	AccessRead      AccessFlags = 1 // CU_MEM_ACCESS_FLAGS_PROT_READ
	AccessReadWrite AccessFlags = 3 // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
)

// HandleType is a CUmemAllocationHandleType: the kind of OS handle a pool's memory can be exported as.
type HandleType int32

const (
	HandleNone        HandleType = 0   // CU_MEM_HANDLE_TYPE_NONE: the pool cannot be exported
	HandlePosixFD     HandleType = 1   // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: an int file descriptor
	HandleWin32       HandleType = 2   // CU_MEM_HANDLE_TYPE_WIN32 (not on Linux)
	HandleWin32KMT    HandleType = 4   // CU_MEM_HANDLE_TYPE_WIN32_KMT (not on Linux)
	HandleFabric      HandleType = 8   // CU_MEM_HANDLE_TYPE_FABRIC (IMEX, multi-node NVLink)
	IpcHandleSize                = 64  // bytes of a CUipcMemHandle, a CUipcEventHandle and a CUmemPoolPtrExportData
	EventInterprocess uint32     = 0x4 // CU_EVENT_INTERPROCESS; needs EventDisableTiming too
	IpcLazyPeerAccess uint32     = 0x1 // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, the only cuIpcOpenMemHandle flag
)

// P2PAttribute is a CUdevice_P2PAttribute: what cuDeviceGetP2PAttribute reports about the path from one
// device to another.
type P2PAttribute int32

const (
	P2PPerformanceRank     P2PAttribute = 1 // CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: relative, lower is faster
	P2PAccessSupported     P2PAttribute = 2 // CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED: 1 when peer access works
	P2PNativeAtomicSupport P2PAttribute = 3 // CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED: atomics over the link
)

// PointerAttribute is a CUpointer_attribute; cudacore reads the integer ones below.
type PointerAttribute int32

const (
	// PointerLegacyIpcCapable is 1 for memory cuIpcGetMemHandle can export (cuMemAlloc's), 0 otherwise.
	PointerLegacyIpcCapable PointerAttribute = 10 // CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
	// PointerAllowedHandleTypes is the bitmask of HandleType the allocation can be exported as.
	PointerAllowedHandleTypes PointerAttribute = 14 // CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES
)

// MemHandle is a CUmemGenericAllocationHandle: the physical allocation behind memory mapped with cuMemMap.
type MemHandle uint64

// IpcHandle is the 64 opaque bytes of a CUipcMemHandle, CUipcEventHandle or CUmemPoolPtrExportData. Only
// the Driver kind that made one can read it, and only in another process (for the cuIpc handles).
type IpcHandle [IpcHandleSize]byte

// MultiDriver is the part of Driver for several devices and processes. Every method names its entry point
// in errors, as the rest of Driver does.
type MultiDriver interface {
	// DeviceCanAccessPeer reports whether dev can access peer's memory directly (cuDeviceCanAccessPeer).
	DeviceCanAccessPeer(dev, peer Device) (bool, error)
	// DeviceGetP2PAttribute reads one attribute of the path from src to dst (cuDeviceGetP2PAttribute). It
	// needs no context. src == dst is ErrorInvalidDevice, as is an ordinal the driver does not have.
	DeviceGetP2PAttribute(attr P2PAttribute, src, dst Device) (int, error)
	// PointerGetAttribute reads an integer attribute of the allocation holding ptr (cuPointerGetAttribute,
	// called in ctx). Memory the driver does not know is ErrorInvalidValue.
	PointerGetAttribute(ctx Context, attr PointerAttribute, ptr DevicePtr) (uint64, error)
	// MemRetainAllocationHandle returns the physical allocation behind ptr, memory mapped with cuMemMap,
	// with one more reference that MemRelease gives back (cuMemRetainAllocationHandle). NCCL registers a
	// buffer with another process this way (docs/contributing/driver-facts.md, "NCCL's user buffers").
	MemRetainAllocationHandle(ctx Context, ptr DevicePtr) (MemHandle, error)
	// MemRelease gives back a reference to a physical allocation (cuMemRelease).
	MemRelease(ctx Context, h MemHandle) error
	// CtxEnablePeerAccess lets ctx's device access peer's memory (cuCtxEnablePeerAccess, made in ctx).
	// Enabling it twice is ErrorPeerAccessAlreadyEnabled; across devices that cannot,
	// ErrorPeerAccessUnsupported.
	CtxEnablePeerAccess(ctx, peer Context) error
	// MemcpyPeerAsync copies n bytes from src in srcCtx to dst in dstCtx, ordered on s, a stream of ctx
	// (cuMemcpyPeerAsync, called in ctx).
	MemcpyPeerAsync(ctx Context, dst DevicePtr, dstCtx Context, src DevicePtr, srcCtx Context, n uint64, s Stream) error
	// MemPoolSetAccess sets what dev may do with pool's memory (cuMemPoolSetAccess, one descriptor).
	MemPoolSetAccess(ctx Context, pool MemPool, dev Device, flags AccessFlags) error
	// MemPoolGetAccess reads what dev may do with pool's memory (cuMemPoolGetAccess).
	MemPoolGetAccess(ctx Context, pool MemPool, dev Device) (AccessFlags, error)
	// MemPoolExportToShareableHandle exports pool as a file descriptor the caller owns (close it when
	// done) (cuMemPoolExportToShareableHandle; HandlePosixFD only).
	MemPoolExportToShareableHandle(ctx Context, pool MemPool, ht HandleType) (int, error)
	// MemPoolImportFromShareableHandle imports a pool another process exported (fd received from it); the
	// caller keeps fd and may close it after the call (cuMemPoolImportFromShareableHandle).
	MemPoolImportFromShareableHandle(ctx Context, fd int, ht HandleType) (MemPool, error)
	// MemPoolExportPointer returns the data that names ptr, an allocation of an exportable pool, to an
	// importer of that pool (cuMemPoolExportPointer).
	MemPoolExportPointer(ctx Context, ptr DevicePtr) (IpcHandle, error)
	// MemPoolImportPointer maps the allocation data names into this process (cuMemPoolImportPointer);
	// free it with MemFree or MemFreeAsync before the exporter frees it.
	MemPoolImportPointer(ctx Context, pool MemPool, data IpcHandle) (DevicePtr, error)
	// IpcGetMemHandle returns the handle of a cuMemAlloc allocation for another process
	// (cuIpcGetMemHandle).
	IpcGetMemHandle(ctx Context, ptr DevicePtr) (IpcHandle, error)
	// IpcOpenMemHandle maps another process's allocation (cuIpcOpenMemHandle_v2 with
	// IpcLazyPeerAccess). A process cannot open its own handles.
	IpcOpenMemHandle(ctx Context, h IpcHandle) (DevicePtr, error)
	// IpcCloseMemHandle unmaps what IpcOpenMemHandle mapped (cuIpcCloseMemHandle).
	IpcCloseMemHandle(ctx Context, ptr DevicePtr) error
	// IpcGetEventHandle returns the handle of an event made with EventInterprocess|EventDisableTiming
	// (cuIpcGetEventHandle).
	IpcGetEventHandle(ctx Context, e Event) (IpcHandle, error)
	// IpcOpenEventHandle opens another process's event (cuIpcOpenEventHandle); destroy it with
	// EventDestroy.
	IpcOpenEventHandle(ctx Context, h IpcHandle) (Event, error)
}
