package libcuda

// binding is one entry point: the cc_table field it fills and the exported names tried for it, newest ABI
// first. The plain names are often older ABIs kept for old binaries (cuMemAlloc takes a 32-bit size), so
// the versioned name is listed whenever cudacore's prototype is the versioned one.
type binding struct {
	field string   // the cc_table field (shim.h); bindings must list them in the struct's order
	names []string // dlsym names, tried in order; the first found is bound and names the op in errors
	// optional marks entry points newer than CUDA 11.2, cudacore's oldest supported driver: when absent,
	// Open still succeeds and only the methods that need it return ErrorNotSupported.
	optional bool
	since    string // the CUDA version that introduced the newest name, for messages
}

// Indexes into bindings, for the methods that name their entry point in errors.
const (
	symInit = iota
	symDriverGetVersion
	symDeviceGetCount
	symDeviceGet
	symDeviceGetName
	symDeviceGetUuid
	symDeviceGetPCIBusId
	symDeviceGetAttribute
	symDeviceTotalMem
	symDeviceGetDefaultMemPool
	symDeviceGetMemPool
	symDeviceSetMemPool
	symDevicePrimaryCtxRetain
	symDevicePrimaryCtxRelease
	symCtxGetCurrent
	symCtxSetCurrent
	symCtxSynchronize
	symCtxSetLimit
	symCtxGetLimit
	symCtxGetStreamPriorityRange
	symMemGetInfo
	symMemAlloc
	symMemFree
	symMemAllocManaged
	symMemPrefetchAsync
	symMemAdvise
	symMemAllocAsync
	symMemAllocFromPoolAsync
	symMemFreeAsync
	symMemPoolCreate
	symMemPoolDestroy
	symMemPoolSetAttribute
	symMemPoolGetAttribute
	symMemPoolTrimTo
	symMemHostAlloc
	symMemFreeHost
	symMemcpyHtoD
	symMemcpyDtoH
	symMemcpyDtoD
	symMemcpyHtoDAsync
	symMemcpyDtoHAsync
	symMemcpyDtoDAsync
	symMemsetD8Async
	symStreamCreateWithPriority
	symStreamDestroy
	symStreamSynchronize
	symStreamQuery
	symStreamWaitEvent
	symStreamBeginCapture
	symStreamEndCapture
	symStreamIsCapturing
	symEventCreate
	symEventDestroy
	symEventRecord
	symEventQuery
	symEventSynchronize
	symEventElapsedTime
	symGraphInstantiateWithFlags
	symGraphUpload
	symGraphLaunch
	symGraphExecUpdate
	symGraphExecDestroy
	symGraphDestroy
	symGraphGetNodes
	symDeviceGraphMemTrim
	symGraphDebugDotPrint
	symModuleLoadData
	symModuleUnload
	symModuleGetFunction
	symFuncGetAttribute
	symLaunchKernel
	symGetErrorName
	symDeviceCanAccessPeer
	symCtxEnablePeerAccess
	symMemcpyPeerAsync
	symMemPoolSetAccess
	symMemPoolGetAccess
	symMemPoolExportToShareableHandle
	symMemPoolImportFromShareableHandle
	symMemPoolExportPointer
	symMemPoolImportPointer
	symIpcGetMemHandle
	symIpcOpenMemHandle
	symIpcCloseMemHandle
	symIpcGetEventHandle
	symIpcOpenEventHandle
	symDeviceGetP2PAttribute
	symPointerGetAttribute
	symMemRetainAllocationHandle
	symMemRelease
	numSyms
)

func req(field string, names ...string) binding { return binding{field: field, names: names} }

func opt(field, since string, names ...string) binding {
	return binding{field: field, names: names, optional: true, since: since}
}

// bindings is the whole binding table, in cc_table order (a test checks it against shim.h, and the fake
// driver in the tests is generated from it). Names without a version suffix are deliberate: those entry
// points have no newer ABI with cudacore's prototype. In particular cuDevicePrimaryCtxRetain has no _v2
// (calling a NULL cuDevicePrimaryCtxRetain_v2 crashed the first prototype), and cuCtxSynchronize_v2
// (CUDA 12.9) takes a context argument, a different prototype, so the plain name is bound. The _ptsz
// per-thread-default-stream variants are never bound: cudacore passes CU_STREAM_PER_THREAD explicitly.
var bindings = [numSyms]binding{
	symInit:                      req("cuInit", "cuInit"),
	symDriverGetVersion:          req("cuDriverGetVersion", "cuDriverGetVersion"),
	symDeviceGetCount:            req("cuDeviceGetCount", "cuDeviceGetCount"),
	symDeviceGet:                 req("cuDeviceGet", "cuDeviceGet"),
	symDeviceGetName:             req("cuDeviceGetName", "cuDeviceGetName"),
	symDeviceGetUuid:             req("cuDeviceGetUuid", "cuDeviceGetUuid_v2", "cuDeviceGetUuid"),
	symDeviceGetPCIBusId:         req("cuDeviceGetPCIBusId", "cuDeviceGetPCIBusId"),
	symDeviceGetAttribute:        req("cuDeviceGetAttribute", "cuDeviceGetAttribute"),
	symDeviceTotalMem:            req("cuDeviceTotalMem", "cuDeviceTotalMem_v2"),
	symDeviceGetDefaultMemPool:   req("cuDeviceGetDefaultMemPool", "cuDeviceGetDefaultMemPool"),
	symDeviceGetMemPool:          req("cuDeviceGetMemPool", "cuDeviceGetMemPool"),
	symDeviceSetMemPool:          req("cuDeviceSetMemPool", "cuDeviceSetMemPool"),
	symDevicePrimaryCtxRetain:    req("cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain"),
	symDevicePrimaryCtxRelease:   req("cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2"),
	symCtxGetCurrent:             req("cuCtxGetCurrent", "cuCtxGetCurrent"),
	symCtxSetCurrent:             req("cuCtxSetCurrent", "cuCtxSetCurrent"),
	symCtxSynchronize:            req("cuCtxSynchronize", "cuCtxSynchronize"),
	symCtxSetLimit:               req("cuCtxSetLimit", "cuCtxSetLimit"),
	symCtxGetLimit:               req("cuCtxGetLimit", "cuCtxGetLimit"),
	symCtxGetStreamPriorityRange: req("cuCtxGetStreamPriorityRange", "cuCtxGetStreamPriorityRange"),
	symMemGetInfo:                req("cuMemGetInfo", "cuMemGetInfo_v2"),
	symMemAlloc:                  req("cuMemAlloc", "cuMemAlloc_v2"),
	symMemFree:                   req("cuMemFree", "cuMemFree_v2"),
	symMemAllocManaged:           req("cuMemAllocManaged", "cuMemAllocManaged"),
	// The unversioned names keep the CUDA 8 prototypes (a device ordinal, -1 for the host); the _v2 ones
	// (CUDA 12.2) take a CUmemLocation.
	symMemPrefetchAsync:         opt("cuMemPrefetchAsync", "8.0", "cuMemPrefetchAsync"),
	symMemAdvise:                opt("cuMemAdvise", "8.0", "cuMemAdvise"),
	symMemAllocAsync:            req("cuMemAllocAsync", "cuMemAllocAsync"),
	symMemAllocFromPoolAsync:    req("cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync"),
	symMemFreeAsync:             req("cuMemFreeAsync", "cuMemFreeAsync"),
	symMemPoolCreate:            req("cuMemPoolCreate", "cuMemPoolCreate"),
	symMemPoolDestroy:           req("cuMemPoolDestroy", "cuMemPoolDestroy"),
	symMemPoolSetAttribute:      req("cuMemPoolSetAttribute", "cuMemPoolSetAttribute"),
	symMemPoolGetAttribute:      req("cuMemPoolGetAttribute", "cuMemPoolGetAttribute"),
	symMemPoolTrimTo:            req("cuMemPoolTrimTo", "cuMemPoolTrimTo"),
	symMemHostAlloc:             req("cuMemHostAlloc", "cuMemHostAlloc"),
	symMemFreeHost:              req("cuMemFreeHost", "cuMemFreeHost"),
	symMemcpyHtoD:               req("cuMemcpyHtoD", "cuMemcpyHtoD_v2"),
	symMemcpyDtoH:               req("cuMemcpyDtoH", "cuMemcpyDtoH_v2"),
	symMemcpyDtoD:               req("cuMemcpyDtoD", "cuMemcpyDtoD_v2"),
	symMemcpyHtoDAsync:          req("cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2"),
	symMemcpyDtoHAsync:          req("cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2"),
	symMemcpyDtoDAsync:          req("cuMemcpyDtoDAsync", "cuMemcpyDtoDAsync_v2"),
	symMemsetD8Async:            req("cuMemsetD8Async", "cuMemsetD8Async"),
	symStreamCreateWithPriority: req("cuStreamCreateWithPriority", "cuStreamCreateWithPriority"),
	symStreamDestroy:            req("cuStreamDestroy", "cuStreamDestroy_v2"),
	symStreamSynchronize:        req("cuStreamSynchronize", "cuStreamSynchronize"),
	symStreamQuery:              req("cuStreamQuery", "cuStreamQuery"),
	symStreamWaitEvent:          req("cuStreamWaitEvent", "cuStreamWaitEvent"),
	symStreamBeginCapture:       req("cuStreamBeginCapture", "cuStreamBeginCapture_v2"),
	symStreamEndCapture:         req("cuStreamEndCapture", "cuStreamEndCapture"),
	symStreamIsCapturing:        req("cuStreamIsCapturing", "cuStreamIsCapturing"),
	symEventCreate:              req("cuEventCreate", "cuEventCreate"),
	symEventDestroy:             req("cuEventDestroy", "cuEventDestroy_v2"),
	symEventRecord:              req("cuEventRecord", "cuEventRecord"),
	symEventQuery:               req("cuEventQuery", "cuEventQuery"),
	symEventSynchronize:         req("cuEventSynchronize", "cuEventSynchronize"),
	// cuEventElapsedTime_v2 (CUDA 12.8) has the same prototype; the plain name serves older drivers.
	symEventElapsedTime:          req("cuEventElapsedTime", "cuEventElapsedTime_v2", "cuEventElapsedTime"),
	symGraphInstantiateWithFlags: opt("cuGraphInstantiateWithFlags", "11.4", "cuGraphInstantiateWithFlags"),
	symGraphUpload:               req("cuGraphUpload", "cuGraphUpload"),
	symGraphLaunch:               req("cuGraphLaunch", "cuGraphLaunch"),
	// The plain cuGraphExecUpdate has another prototype (error node and result as two out parameters), so
	// it is no fallback.
	symGraphExecUpdate:  opt("cuGraphExecUpdate", "12.0", "cuGraphExecUpdate_v2"),
	symGraphExecDestroy: req("cuGraphExecDestroy", "cuGraphExecDestroy"),
	symGraphDestroy:     req("cuGraphDestroy", "cuGraphDestroy"),
	// CUDA 12.3 and 13.0 versioned several graph-topology entry points (edge data); a _v2 of this one, if a
	// driver exports it, is taken to keep the (graph, nodes, count) prototype, which is all cudacore uses.
	symGraphGetNodes:      req("cuGraphGetNodes", "cuGraphGetNodes_v2", "cuGraphGetNodes"),
	symDeviceGraphMemTrim: opt("cuDeviceGraphMemTrim", "11.4", "cuDeviceGraphMemTrim"),
	symGraphDebugDotPrint: opt("cuGraphDebugDotPrint", "11.3", "cuGraphDebugDotPrint"),
	symModuleLoadData:     req("cuModuleLoadData", "cuModuleLoadData"),
	symModuleUnload:       req("cuModuleUnload", "cuModuleUnload"),
	symModuleGetFunction:  req("cuModuleGetFunction", "cuModuleGetFunction"),
	symFuncGetAttribute:   req("cuFuncGetAttribute", "cuFuncGetAttribute"),
	symLaunchKernel:       req("cuLaunchKernel", "cuLaunchKernel"),
	symGetErrorName:       opt("cuGetErrorName", "6.0", "cuGetErrorName"),
	// Several devices and processes (multi.go). cuIpcOpenMemHandle_v2 (CUDA 11.0) has the plain name's
	// prototype; the plain name is kept by drivers for old binaries only, so the _v2 is required.
	symDeviceCanAccessPeer:              req("cuDeviceCanAccessPeer", "cuDeviceCanAccessPeer"),
	symCtxEnablePeerAccess:              req("cuCtxEnablePeerAccess", "cuCtxEnablePeerAccess"),
	symMemcpyPeerAsync:                  req("cuMemcpyPeerAsync", "cuMemcpyPeerAsync"),
	symMemPoolSetAccess:                 req("cuMemPoolSetAccess", "cuMemPoolSetAccess"),
	symMemPoolGetAccess:                 req("cuMemPoolGetAccess", "cuMemPoolGetAccess"),
	symMemPoolExportToShareableHandle:   req("cuMemPoolExportToShareableHandle", "cuMemPoolExportToShareableHandle"),
	symMemPoolImportFromShareableHandle: req("cuMemPoolImportFromShareableHandle", "cuMemPoolImportFromShareableHandle"),
	symMemPoolExportPointer:             req("cuMemPoolExportPointer", "cuMemPoolExportPointer"),
	symMemPoolImportPointer:             req("cuMemPoolImportPointer", "cuMemPoolImportPointer"),
	symIpcGetMemHandle:                  req("cuIpcGetMemHandle", "cuIpcGetMemHandle"),
	symIpcOpenMemHandle:                 req("cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2"),
	symIpcCloseMemHandle:                req("cuIpcCloseMemHandle", "cuIpcCloseMemHandle"),
	symIpcGetEventHandle:                req("cuIpcGetEventHandle", "cuIpcGetEventHandle"),
	symIpcOpenEventHandle:               req("cuIpcOpenEventHandle", "cuIpcOpenEventHandle"),
	symDeviceGetP2PAttribute:            req("cuDeviceGetP2PAttribute", "cuDeviceGetP2PAttribute"),
	symPointerGetAttribute:              req("cuPointerGetAttribute", "cuPointerGetAttribute"),
	symMemRetainAllocationHandle:        opt("cuMemRetainAllocationHandle", "11.0", "cuMemRetainAllocationHandle"),
	symMemRelease:                       opt("cuMemRelease", "10.2", "cuMemRelease"),
}
