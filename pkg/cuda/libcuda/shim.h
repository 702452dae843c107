// shim.h declares, without cuda.h, the few CUDA driver types cudacore passes across the boundary, the table
// of entry points that Open fills, and the C wrappers that Go calls (shim.c).
//
// Why no cuda.h: the module must build on any Linux machine, with no CUDA toolkit installed. The types here
// are copied from cuda.h (CUDA 12.x and 13.0, x86-64 and aarch64 Linux); the static asserts in shim.c pin
// the layouts that matter.
#ifndef CUDACORE_LIBCUDA_SHIM_H
#define CUDACORE_LIBCUDA_SHIM_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef void *CUgraph;
typedef void *CUgraphExec;
typedef void *CUgraphNode;
typedef void *CUmemoryPool;
typedef void *CUmodule;
typedef void *CUfunction;

typedef struct {
	unsigned char bytes[16];
} CUuuid;

// CUmemPoolProps as in cuda.h 12.2+ and 13.0 (88 bytes on LP64).
typedef struct {
	int allocType;   // CUmemAllocationType: CU_MEM_ALLOCATION_TYPE_PINNED = 1
	int handleTypes; // CUmemAllocationHandleType: CU_MEM_HANDLE_TYPE_NONE = 0
	struct {
		int type; // CUmemLocationType: CU_MEM_LOCATION_TYPE_DEVICE = 1
		int id;
	} location;
	void *win32SecurityAttributes;
	size_t maxSize;
	unsigned short usage;
	unsigned char reserved[54];
} CUmemPoolProps;

// CUmemAccessDesc: a CUmemLocation and CUmemAccess_flags (12 bytes).
typedef struct {
	struct {
		int type; // CU_MEM_LOCATION_TYPE_DEVICE = 1
		int id;
	} location;
	int flags;
} CUmemAccessDesc;

// CUipcMemHandle, CUipcEventHandle and CUmemPoolPtrExportData: 64 opaque bytes each; the cuIpc ones are
// passed by value.
typedef struct {
	char reserved[64];
} CUipcMemHandle;
typedef struct {
	char reserved[64];
} CUipcEventHandle;
typedef struct {
	unsigned char reserved[64];
} CUmemPoolPtrExportData;

// CUgraphExecUpdateResultInfo (cuGraphExecUpdate_v2's out parameter).
typedef struct {
	int result; // CUgraphExecUpdateResult
	CUgraphNode errorNode;
	CUgraphNode errorFromNode;
} CUgraphExecUpdateResultInfo;

// The entry point table. One field per binding in bindings.go (the field is the name without a version
// suffix); a test checks the two agree. Every field is typed with the prototype of the exact symbol bound,
// so a wrong argument is a compile error here, not a crash on the GPU machine.
typedef struct {
	CUresult (*cuInit)(unsigned int);
	CUresult (*cuDriverGetVersion)(int *);
	CUresult (*cuDeviceGetCount)(int *);
	CUresult (*cuDeviceGet)(CUdevice *, int);
	CUresult (*cuDeviceGetName)(char *, int, CUdevice);
	CUresult (*cuDeviceGetUuid)(CUuuid *, CUdevice);
	CUresult (*cuDeviceGetPCIBusId)(char *, int, CUdevice);
	CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
	CUresult (*cuDeviceTotalMem)(size_t *, CUdevice);
	CUresult (*cuDeviceGetDefaultMemPool)(CUmemoryPool *, CUdevice);
	CUresult (*cuDeviceGetMemPool)(CUmemoryPool *, CUdevice);
	CUresult (*cuDeviceSetMemPool)(CUdevice, CUmemoryPool);
	CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
	CUresult (*cuCtxGetCurrent)(CUcontext *);
	CUresult (*cuCtxSetCurrent)(CUcontext);
	CUresult (*cuCtxSynchronize)(void);
	CUresult (*cuCtxSetLimit)(int, size_t);
	CUresult (*cuCtxGetLimit)(size_t *, int);
	CUresult (*cuCtxGetStreamPriorityRange)(int *, int *);
	CUresult (*cuMemGetInfo)(size_t *, size_t *);
	CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
	CUresult (*cuMemFree)(CUdeviceptr);
	CUresult (*cuMemAllocManaged)(CUdeviceptr *, size_t, unsigned int);
	CUresult (*cuMemPrefetchAsync)(CUdeviceptr, size_t, CUdevice, CUstream);
	CUresult (*cuMemAdvise)(CUdeviceptr, size_t, int, CUdevice);
	CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, CUstream);
	CUresult (*cuMemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
	CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream);
	CUresult (*cuMemPoolCreate)(CUmemoryPool *, const CUmemPoolProps *);
	CUresult (*cuMemPoolDestroy)(CUmemoryPool);
	CUresult (*cuMemPoolSetAttribute)(CUmemoryPool, int, void *);
	CUresult (*cuMemPoolGetAttribute)(CUmemoryPool, int, void *);
	CUresult (*cuMemPoolTrimTo)(CUmemoryPool, size_t);
	CUresult (*cuMemHostAlloc)(void **, size_t, unsigned int);
	CUresult (*cuMemFreeHost)(void *);
	CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
	CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
	CUresult (*cuMemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
	CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
	CUresult (*cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
	CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
	CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
	CUresult (*cuStreamCreateWithPriority)(CUstream *, unsigned int, int);
	CUresult (*cuStreamDestroy)(CUstream);
	CUresult (*cuStreamSynchronize)(CUstream);
	CUresult (*cuStreamQuery)(CUstream);
	CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned int);
	CUresult (*cuStreamBeginCapture)(CUstream, int);
	CUresult (*cuStreamEndCapture)(CUstream, CUgraph *);
	CUresult (*cuStreamIsCapturing)(CUstream, int *);
	CUresult (*cuEventCreate)(CUevent *, unsigned int);
	CUresult (*cuEventDestroy)(CUevent);
	CUresult (*cuEventRecord)(CUevent, CUstream);
	CUresult (*cuEventQuery)(CUevent);
	CUresult (*cuEventSynchronize)(CUevent);
	CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent);
	CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec *, CUgraph, unsigned long long);
	CUresult (*cuGraphUpload)(CUgraphExec, CUstream);
	CUresult (*cuGraphLaunch)(CUgraphExec, CUstream);
	CUresult (*cuGraphExecUpdate)(CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo *);
	CUresult (*cuGraphExecDestroy)(CUgraphExec);
	CUresult (*cuGraphDestroy)(CUgraph);
	CUresult (*cuGraphGetNodes)(CUgraph, CUgraphNode *, size_t *);
	CUresult (*cuDeviceGraphMemTrim)(CUdevice);
	CUresult (*cuGraphDebugDotPrint)(CUgraph, const char *, unsigned int);
	CUresult (*cuModuleLoadData)(CUmodule *, const void *);
	CUresult (*cuModuleUnload)(CUmodule);
	CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
	CUresult (*cuFuncGetAttribute)(int *, int, CUfunction);
	CUresult (*cuLaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
	                           unsigned int, unsigned int, CUstream, void **, void **);
	CUresult (*cuGetErrorName)(CUresult, const char **);
	CUresult (*cuDeviceCanAccessPeer)(int *, CUdevice, CUdevice);
	CUresult (*cuCtxEnablePeerAccess)(CUcontext, unsigned int);
	CUresult (*cuMemcpyPeerAsync)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream);
	CUresult (*cuMemPoolSetAccess)(CUmemoryPool, const CUmemAccessDesc *, size_t);
	CUresult (*cuMemPoolGetAccess)(int *, CUmemoryPool, void *);
	CUresult (*cuMemPoolExportToShareableHandle)(void *, CUmemoryPool, int, unsigned long long);
	CUresult (*cuMemPoolImportFromShareableHandle)(CUmemoryPool *, void *, int, unsigned long long);
	CUresult (*cuMemPoolExportPointer)(CUmemPoolPtrExportData *, CUdeviceptr);
	CUresult (*cuMemPoolImportPointer)(CUdeviceptr *, CUmemoryPool, CUmemPoolPtrExportData *);
	CUresult (*cuIpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
	CUresult (*cuIpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned int);
	CUresult (*cuIpcCloseMemHandle)(CUdeviceptr);
	CUresult (*cuIpcGetEventHandle)(CUipcEventHandle *, CUevent);
	CUresult (*cuIpcOpenEventHandle)(CUevent *, CUipcEventHandle);
	CUresult (*cuDeviceGetP2PAttribute)(int *, int, CUdevice, CUdevice);
	CUresult (*cuPointerGetAttribute)(void *, int, CUdeviceptr);
	CUresult (*cuMemRetainAllocationHandle)(unsigned long long *, void *);
	CUresult (*cuMemRelease)(unsigned long long);
} cc_table;

// Flags that a wrapper ORs into its result when the failure came from making the context current rather
// than from the entry point itself, so Go can name the right entry point without a second cgo call or an
// out parameter. CUresult values are small positive numbers, so these bits never collide with one.
#define CC_FAIL_GETCURRENT 0x10000000
#define CC_FAIL_SETCURRENT 0x20000000
#define CC_FAIL_NOCONTEXT 0x40000000
#define CC_FAIL_MASK 0x70000000

// Loading.
void *cc_dlopen(const char *path, char *err, size_t errlen);
void *cc_dlsym(void *lib, const char *name);
void cc_dlclose(void *lib);
cc_table *cc_table_new(void);
void cc_table_set(cc_table *t, size_t index, void *fn);
void *cc_table_get(const cc_table *t, size_t index);
size_t cc_table_len(void);
size_t cc_mempoolprops_size(void);

// Calls that need no context.
CUresult cc_init(const cc_table *t);
CUresult cc_driverGetVersion(const cc_table *t, int *v);
CUresult cc_deviceGetCount(const cc_table *t, int *n);
CUresult cc_deviceGet(const cc_table *t, int ordinal, int *dev);
CUresult cc_deviceGetName(const cc_table *t, int dev, char *buf, int len);
CUresult cc_deviceGetUuid(const cc_table *t, int dev, unsigned char *out16);
CUresult cc_deviceGetPCIBusId(const cc_table *t, int dev, char *buf, int len);
CUresult cc_deviceGetAttribute(const cc_table *t, int dev, int attr, int *v);
CUresult cc_deviceTotalMem(const cc_table *t, int dev, unsigned long long *bytes);
CUresult cc_deviceGetDefaultMemPool(const cc_table *t, int dev, uintptr_t *pool);
CUresult cc_deviceGetMemPool(const cc_table *t, int dev, uintptr_t *pool);
CUresult cc_deviceSetMemPool(const cc_table *t, int dev, uintptr_t pool);
CUresult cc_primaryCtxRetain(const cc_table *t, int dev, uintptr_t *ctx);
CUresult cc_primaryCtxRelease(const cc_table *t, int dev);
const char *cc_getErrorName(const cc_table *t, CUresult r);

// Calls that run in a context: each makes ctx current on this thread, then calls the entry point.
CUresult cc_ctxSynchronize(const cc_table *t, uintptr_t ctx);
CUresult cc_ctxSetLimit(const cc_table *t, uintptr_t ctx, int limit, unsigned long long v);
CUresult cc_ctxGetLimit(const cc_table *t, uintptr_t ctx, int limit, unsigned long long *v);
CUresult cc_ctxGetStreamPriorityRange(const cc_table *t, uintptr_t ctx, int *least, int *greatest);
CUresult cc_memGetInfo(const cc_table *t, uintptr_t ctx, unsigned long long *free, unsigned long long *total);
CUresult cc_memAlloc(const cc_table *t, uintptr_t ctx, unsigned long long n, CUdeviceptr *p);
CUresult cc_memFree(const cc_table *t, uintptr_t ctx, CUdeviceptr p);
CUresult cc_memAllocManaged(const cc_table *t, uintptr_t ctx, unsigned long long n, unsigned int flags,
                            CUdeviceptr *p);
CUresult cc_memPrefetchAsync(const cc_table *t, uintptr_t ctx, CUdeviceptr p, unsigned long long n, int dst, uintptr_t s);
CUresult cc_memAdvise(const cc_table *t, uintptr_t ctx, CUdeviceptr p, unsigned long long n, int advice, int dev);
CUresult cc_memAllocAsync(const cc_table *t, uintptr_t ctx, unsigned long long n, uintptr_t s, CUdeviceptr *p);
CUresult cc_memAllocFromPoolAsync(const cc_table *t, uintptr_t ctx, unsigned long long n, uintptr_t pool,
                                  uintptr_t s, CUdeviceptr *p);
CUresult cc_memFreeAsync(const cc_table *t, uintptr_t ctx, CUdeviceptr p, uintptr_t s);
// cc_memPoolCreate creates a pool of pinned memory on dev with the given handle types and maximum size
// (0: the driver's default; nonzero needs a driver whose CUmemPoolProps has maxSize, CUDA 12.2+).
CUresult cc_memPoolCreate(const cc_table *t, uintptr_t ctx, int dev, int handleTypes, unsigned long long maxSize,
                          uintptr_t *pool);
CUresult cc_memPoolDestroy(const cc_table *t, uintptr_t ctx, uintptr_t pool);
CUresult cc_memPoolSetAttribute(const cc_table *t, uintptr_t ctx, uintptr_t pool, int attr, unsigned long long v);
CUresult cc_memPoolGetAttribute(const cc_table *t, uintptr_t ctx, uintptr_t pool, int attr,
                                unsigned long long *v);
CUresult cc_memPoolTrimTo(const cc_table *t, uintptr_t ctx, uintptr_t pool, unsigned long long keep);
CUresult cc_memHostAlloc(const cc_table *t, uintptr_t ctx, unsigned long long n, unsigned int flags, void **p);
CUresult cc_memFreeHost(const cc_table *t, uintptr_t ctx, void *p);
CUresult cc_memcpyHtoD(const cc_table *t, uintptr_t ctx, CUdeviceptr dst, const void *src, size_t n);
CUresult cc_memcpyDtoH(const cc_table *t, uintptr_t ctx, void *dst, CUdeviceptr src, size_t n);
CUresult cc_memcpyDtoD(const cc_table *t, uintptr_t ctx, CUdeviceptr dst, CUdeviceptr src, unsigned long long n);
CUresult cc_memcpyHtoDAsync(const cc_table *t, uintptr_t ctx, CUdeviceptr dst, const void *src, size_t n,
                            uintptr_t s);
CUresult cc_memcpyDtoHAsync(const cc_table *t, uintptr_t ctx, void *dst, CUdeviceptr src, size_t n, uintptr_t s);
CUresult cc_memcpyDtoDAsync(const cc_table *t, uintptr_t ctx, CUdeviceptr dst, CUdeviceptr src,
                            unsigned long long n, uintptr_t s);
CUresult cc_memsetD8Async(const cc_table *t, uintptr_t ctx, CUdeviceptr dst, unsigned char v, unsigned long long n,
                          uintptr_t s);
CUresult cc_streamCreate(const cc_table *t, uintptr_t ctx, unsigned int flags, int prio, uintptr_t *s);
CUresult cc_streamDestroy(const cc_table *t, uintptr_t ctx, uintptr_t s);
CUresult cc_streamSynchronize(const cc_table *t, uintptr_t ctx, uintptr_t s);
// cc_drainPerThreadAtExit arranges for the calling thread, when it exits, to synchronize its per-thread
// default stream in ctx before the driver tears that stream down (once per thread and context; up to 16
// contexts a thread). 0 when arranged (or already), nonzero when it could not be.
int cc_drainPerThreadAtExit(const cc_table *t, uintptr_t ctx);
CUresult cc_streamQuery(const cc_table *t, uintptr_t ctx, uintptr_t s);
CUresult cc_streamWaitEvent(const cc_table *t, uintptr_t ctx, uintptr_t s, uintptr_t e);
CUresult cc_streamBeginCapture(const cc_table *t, uintptr_t ctx, uintptr_t s, int mode);
CUresult cc_streamEndCapture(const cc_table *t, uintptr_t ctx, uintptr_t s, uintptr_t *g);
CUresult cc_streamIsCapturing(const cc_table *t, uintptr_t ctx, uintptr_t s, int *status);
CUresult cc_eventCreate(const cc_table *t, uintptr_t ctx, unsigned int flags, uintptr_t *e);
CUresult cc_eventDestroy(const cc_table *t, uintptr_t ctx, uintptr_t e);
CUresult cc_eventRecord(const cc_table *t, uintptr_t ctx, uintptr_t e, uintptr_t s);
CUresult cc_eventQuery(const cc_table *t, uintptr_t ctx, uintptr_t e);
CUresult cc_eventSynchronize(const cc_table *t, uintptr_t ctx, uintptr_t e);
CUresult cc_eventElapsedTime(const cc_table *t, uintptr_t ctx, uintptr_t start, uintptr_t end, float *ms);
CUresult cc_graphInstantiate(const cc_table *t, uintptr_t ctx, uintptr_t g, uintptr_t *exec);
CUresult cc_graphUpload(const cc_table *t, uintptr_t ctx, uintptr_t exec, uintptr_t s);
CUresult cc_graphLaunch(const cc_table *t, uintptr_t ctx, uintptr_t exec, uintptr_t s);
CUresult cc_deviceGraphMemTrim(const cc_table *t, uintptr_t ctx, int dev);
CUresult cc_graphExecUpdate(const cc_table *t, uintptr_t ctx, uintptr_t exec, uintptr_t g, int *updateResult);
CUresult cc_graphExecDestroy(const cc_table *t, uintptr_t ctx, uintptr_t exec);
CUresult cc_graphDestroy(const cc_table *t, uintptr_t ctx, uintptr_t g);
CUresult cc_graphNodeCount(const cc_table *t, uintptr_t ctx, uintptr_t g, unsigned long long *n);
CUresult cc_graphDebugDotPrint(const cc_table *t, uintptr_t ctx, uintptr_t g, const char *path, unsigned int flags);
CUresult cc_moduleLoadData(const cc_table *t, uintptr_t ctx, const void *image, uintptr_t *mod);
CUresult cc_moduleUnload(const cc_table *t, uintptr_t ctx, uintptr_t mod);
CUresult cc_moduleGetFunction(const cc_table *t, uintptr_t ctx, uintptr_t mod, const char *name, uintptr_t *fn);
CUresult cc_funcGetAttribute(const cc_table *t, uintptr_t ctx, uintptr_t fn, int attr, int *v);
CUresult cc_launchKernel(const cc_table *t, uintptr_t ctx, uintptr_t fn, const unsigned int *grid,
                         const unsigned int *block, unsigned int shared, uintptr_t s, void **params);

// Several devices and processes (multi.c). Handles of 64 bytes cross as unsigned char[64].
CUresult cc_deviceCanAccessPeer(const cc_table *t, int dev, int peer, int *can);
CUresult cc_ctxEnablePeerAccess(const cc_table *t, uintptr_t ctx, uintptr_t peer);
CUresult cc_memcpyPeerAsync(const cc_table *t, uintptr_t ctx, CUdeviceptr dst, uintptr_t dstCtx, CUdeviceptr src,
                            uintptr_t srcCtx, unsigned long long n, uintptr_t s);
CUresult cc_memPoolSetAccess(const cc_table *t, uintptr_t ctx, uintptr_t pool, int dev, int flags);
CUresult cc_memPoolGetAccess(const cc_table *t, uintptr_t ctx, uintptr_t pool, int dev, int *flags);
CUresult cc_memPoolExportToShareableHandle(const cc_table *t, uintptr_t ctx, uintptr_t pool, int handleType, int *fd);
CUresult cc_memPoolImportFromShareableHandle(const cc_table *t, uintptr_t ctx, int fd, int handleType,
                                             uintptr_t *pool);
CUresult cc_memPoolExportPointer(const cc_table *t, uintptr_t ctx, CUdeviceptr p, unsigned char *out64);
CUresult cc_memPoolImportPointer(const cc_table *t, uintptr_t ctx, uintptr_t pool, const unsigned char *data64,
                                 CUdeviceptr *p);
CUresult cc_ipcGetMemHandle(const cc_table *t, uintptr_t ctx, CUdeviceptr p, unsigned char *out64);
CUresult cc_ipcOpenMemHandle(const cc_table *t, uintptr_t ctx, const unsigned char *h64, unsigned int flags,
                             CUdeviceptr *p);
CUresult cc_ipcCloseMemHandle(const cc_table *t, uintptr_t ctx, CUdeviceptr p);
CUresult cc_ipcGetEventHandle(const cc_table *t, uintptr_t ctx, uintptr_t e, unsigned char *out64);
CUresult cc_ipcOpenEventHandle(const cc_table *t, uintptr_t ctx, const unsigned char *h64, uintptr_t *e);
CUresult cc_deviceGetP2PAttribute(const cc_table *t, int attr, int src, int dst, int *v);
CUresult cc_pointerGetAttribute(const cc_table *t, uintptr_t ctx, int attr, CUdeviceptr p, unsigned long long *v);
CUresult cc_memRetainAllocationHandle(const cc_table *t, uintptr_t ctx, CUdeviceptr p, unsigned long long *h);
CUresult cc_memRelease(const cc_table *t, uintptr_t ctx, unsigned long long h);

#endif
