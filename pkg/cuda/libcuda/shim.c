// shim.c: the C half of package libcuda. Every wrapper that takes a context makes it current and calls the
// entry point in the same C function: a goroutine can move to another OS thread between two cgo calls, and
// CUDA contexts are per thread, so a separate "set current" call from Go could bind the wrong thread.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

_Static_assert(sizeof(CUmemPoolProps) == 88, "CUmemPoolProps must match cuda.h (88 bytes)");
_Static_assert(offsetof(CUmemPoolProps, win32SecurityAttributes) == 16, "CUmemPoolProps layout");
_Static_assert(offsetof(CUmemPoolProps, maxSize) == 24, "CUmemPoolProps layout");
_Static_assert(offsetof(CUmemPoolProps, usage) == 32, "CUmemPoolProps layout");
_Static_assert(sizeof(CUuuid) == 16, "CUuuid is 16 bytes");
// cc_table_set/get address the table as an array of pointers.
_Static_assert(sizeof(cc_table) % sizeof(void *) == 0, "cc_table holds only pointers");

enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_NOT_SUPPORTED = 801 };

void *cc_dlopen(const char *path, char *err, size_t errlen) {
	// dlerror's text is per thread and is only valid until the next dl* call on it, so it is read here, in
	// the same C call as dlopen, and copied out.
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL && errlen > 0) {
		const char *e = dlerror();
		strncpy(err, e ? e : "unknown dlopen error", errlen - 1);
		err[errlen - 1] = 0;
	}
	return h;
}

void *cc_dlsym(void *lib, const char *name) {
	// A NULL result means "absent" here: no CUDA entry point is legitimately at address 0.
	return dlsym(lib, name);
}

void cc_dlclose(void *lib) { dlclose(lib); }

cc_table *cc_table_new(void) { return (cc_table *)calloc(1, sizeof(cc_table)); }

size_t cc_table_len(void) { return sizeof(cc_table) / sizeof(void *); }

size_t cc_mempoolprops_size(void) { return sizeof(CUmemPoolProps); }

void cc_table_set(cc_table *t, size_t index, void *fn) {
	if (index < cc_table_len()) memcpy((char *)t + index * sizeof(void *), &fn, sizeof fn);
}

void *cc_table_get(const cc_table *t, size_t index) {
	void *fn = NULL;
	if (index < cc_table_len()) memcpy(&fn, (const char *)t + index * sizeof(void *), sizeof fn);
	return fn;
}

// cc_ensure makes ctx current on the calling thread. cuCtxGetCurrent is a thread-local read in the driver, so
// checking first makes the common case (already current) cost almost nothing, while cuCtxSetCurrent may take
// a lock.
static inline CUresult cc_ensure(const cc_table *t, uintptr_t ctx) {
	CUcontext cur = NULL;
	CUresult r;
	if (ctx == 0) return CC_FAIL_NOCONTEXT;
	r = t->cuCtxGetCurrent(&cur);
	if (r != CUDA_SUCCESS) return r | CC_FAIL_GETCURRENT;
	if ((uintptr_t)cur == ctx) return CUDA_SUCCESS;
	r = t->cuCtxSetCurrent((CUcontext)ctx);
	if (r != CUDA_SUCCESS) return r | CC_FAIL_SETCURRENT;
	return CUDA_SUCCESS;
}

#define ENSURE                                   \
	do {                                         \
		CUresult r_ = cc_ensure(t, ctx);         \
		if (r_ != CUDA_SUCCESS) return r_;       \
	} while (0)

// Optional entry points may be NULL; Go checks first, and this is the backstop that keeps a NULL call from
// ever happening.
#define NEED(f)                                             \
	do {                                                    \
		if (t->f == NULL) return CUDA_ERROR_NOT_SUPPORTED;  \
	} while (0)

CUresult cc_init(const cc_table *t) { return t->cuInit(0); }
CUresult cc_driverGetVersion(const cc_table *t, int *v) { return t->cuDriverGetVersion(v); }
CUresult cc_deviceGetCount(const cc_table *t, int *n) { return t->cuDeviceGetCount(n); }
CUresult cc_deviceGet(const cc_table *t, int ordinal, int *dev) { return t->cuDeviceGet(dev, ordinal); }
CUresult cc_deviceGetName(const cc_table *t, int dev, char *buf, int len) {
	return t->cuDeviceGetName(buf, len, dev);
}
CUresult cc_deviceGetUuid(const cc_table *t, int dev, unsigned char *out16) {
	CUuuid u;
	CUresult r;
	memset(&u, 0, sizeof u);
	r = t->cuDeviceGetUuid(&u, dev);
	if (r == CUDA_SUCCESS) memcpy(out16, u.bytes, 16);
	return r;
}
CUresult cc_deviceGetPCIBusId(const cc_table *t, int dev, char *buf, int len) {
	return t->cuDeviceGetPCIBusId(buf, len, dev);
}
CUresult cc_deviceGetAttribute(const cc_table *t, int dev, int attr, int *v) {
	return t->cuDeviceGetAttribute(v, attr, dev);
}
CUresult cc_deviceTotalMem(const cc_table *t, int dev, unsigned long long *bytes) {
	size_t b = 0;
	CUresult r = t->cuDeviceTotalMem(&b, dev);
	*bytes = b;
	return r;
}
CUresult cc_deviceGetDefaultMemPool(const cc_table *t, int dev, uintptr_t *pool) {
	CUmemoryPool p = NULL;
	CUresult r = t->cuDeviceGetDefaultMemPool(&p, dev);
	*pool = (uintptr_t)p;
	return r;
}
CUresult cc_deviceGetMemPool(const cc_table *t, int dev, uintptr_t *pool) {
	CUmemoryPool p = NULL;
	CUresult r = t->cuDeviceGetMemPool(&p, dev);
	*pool = (uintptr_t)p;
	return r;
}
CUresult cc_deviceSetMemPool(const cc_table *t, int dev, uintptr_t pool) {
	return t->cuDeviceSetMemPool(dev, (CUmemoryPool)pool);
}
CUresult cc_primaryCtxRetain(const cc_table *t, int dev, uintptr_t *ctx) {
	CUcontext c = NULL;
	CUresult r = t->cuDevicePrimaryCtxRetain(&c, dev);
	*ctx = (uintptr_t)c;
	return r;
}
CUresult cc_primaryCtxRelease(const cc_table *t, int dev) { return t->cuDevicePrimaryCtxRelease(dev); }
const char *cc_getErrorName(const cc_table *t, CUresult r) {
	const char *s = NULL;
	if (t->cuGetErrorName == NULL || t->cuGetErrorName(r, &s) != CUDA_SUCCESS) return NULL;
	return s;
}

CUresult cc_ctxSynchronize(const cc_table *t, uintptr_t ctx) {
	ENSURE;
	return t->cuCtxSynchronize();
}
CUresult cc_ctxSetLimit(const cc_table *t, uintptr_t ctx, int limit, unsigned long long v) {
	ENSURE;
	return t->cuCtxSetLimit(limit, (size_t)v);
}
CUresult cc_ctxGetLimit(const cc_table *t, uintptr_t ctx, int limit, unsigned long long *v) {
	size_t x = 0;
	CUresult r;
	ENSURE;
	r = t->cuCtxGetLimit(&x, limit);
	*v = x;
	return r;
}
CUresult cc_ctxGetStreamPriorityRange(const cc_table *t, uintptr_t ctx, int *least, int *greatest) {
	ENSURE;
	return t->cuCtxGetStreamPriorityRange(least, greatest);
}
CUresult cc_memGetInfo(const cc_table *t, uintptr_t ctx, unsigned long long *free, unsigned long long *total) {
	size_t f = 0, tot = 0;
	CUresult r;
	ENSURE;
	r = t->cuMemGetInfo(&f, &tot);
	*free = f;
	*total = tot;
	return r;
}
CUresult cc_memAlloc(const cc_table *t, uintptr_t ctx, unsigned long long n, CUdeviceptr *p) {
	ENSURE;
	return t->cuMemAlloc(p, (size_t)n);
}
CUresult cc_memFree(const cc_table *t, uintptr_t ctx, CUdeviceptr p) {
	ENSURE;
	return t->cuMemFree(p);
}
CUresult cc_memAllocManaged(const cc_table *t, uintptr_t ctx, unsigned long long n, unsigned int flags,
                            CUdeviceptr *p) {
	ENSURE;
	return t->cuMemAllocManaged(p, (size_t)n, flags);
}
CUresult cc_memPrefetchAsync(const cc_table *t, uintptr_t ctx, CUdeviceptr p, unsigned long long n, int dst, uintptr_t s) {
	NEED(cuMemPrefetchAsync);
	ENSURE;
	return t->cuMemPrefetchAsync(p, (size_t)n, (CUdevice)dst, (CUstream)s);
}
CUresult cc_memAdvise(const cc_table *t, uintptr_t ctx, CUdeviceptr p, unsigned long long n, int advice, int dev) {
	NEED(cuMemAdvise);
	ENSURE;
	return t->cuMemAdvise(p, (size_t)n, advice, (CUdevice)dev);
}
CUresult cc_memAllocAsync(const cc_table *t, uintptr_t ctx, unsigned long long n, uintptr_t s, CUdeviceptr *p) {
	ENSURE;
	return t->cuMemAllocAsync(p, (size_t)n, (CUstream)s);
}
CUresult cc_memAllocFromPoolAsync(const cc_table *t, uintptr_t ctx, unsigned long long n, uintptr_t pool,
                                  uintptr_t s, CUdeviceptr *p) {
	ENSURE;
	return t->cuMemAllocFromPoolAsync(p, (size_t)n, (CUmemoryPool)pool, (CUstream)s);
}
CUresult cc_memFreeAsync(const cc_table *t, uintptr_t ctx, CUdeviceptr p, uintptr_t s) {
	ENSURE;
	return t->cuMemFreeAsync(p, (CUstream)s);
}
CUresult cc_memPoolCreate(const cc_table *t, uintptr_t ctx, int dev, int handleTypes, unsigned long long maxSize,
                          uintptr_t *pool) {
	CUmemPoolProps props;
	CUmemoryPool p = NULL;
	CUresult r;
	ENSURE;
	// Zeroed first: reserved bytes must be 0, and a driver newer than this struct reads them.
	memset(&props, 0, sizeof props);
	props.allocType = 1; // CU_MEM_ALLOCATION_TYPE_PINNED
	props.handleTypes = handleTypes;
	props.location.type = 1; // CU_MEM_LOCATION_TYPE_DEVICE
	props.location.id = dev;
	props.maxSize = (size_t)maxSize;
	r = t->cuMemPoolCreate(&p, &props);
	*pool = (uintptr_t)p;
	return r;
}
CUresult cc_memPoolDestroy(const cc_table *t, uintptr_t ctx, uintptr_t pool) {
	ENSURE;
	return t->cuMemPoolDestroy((CUmemoryPool)pool);
}
CUresult cc_memPoolSetAttribute(const cc_table *t, uintptr_t ctx, uintptr_t pool, int attr, unsigned long long v) {
	unsigned long long x = v; // cuuint64_t: the attributes cudacore sets are all 64-bit
	ENSURE;
	return t->cuMemPoolSetAttribute((CUmemoryPool)pool, attr, &x);
}
CUresult cc_memPoolGetAttribute(const cc_table *t, uintptr_t ctx, uintptr_t pool, int attr,
                                unsigned long long *v) {
	unsigned long long x = 0;
	CUresult r;
	ENSURE;
	r = t->cuMemPoolGetAttribute((CUmemoryPool)pool, attr, &x);
	*v = x;
	return r;
}
CUresult cc_memPoolTrimTo(const cc_table *t, uintptr_t ctx, uintptr_t pool, unsigned long long keep) {
	ENSURE;
	return t->cuMemPoolTrimTo((CUmemoryPool)pool, (size_t)keep);
}
CUresult cc_memHostAlloc(const cc_table *t, uintptr_t ctx, unsigned long long n, unsigned int flags, void **p) {
	ENSURE;
	return t->cuMemHostAlloc(p, (size_t)n, flags);
}
CUresult cc_memFreeHost(const cc_table *t, uintptr_t ctx, void *p) {
	ENSURE;
	return t->cuMemFreeHost(p);
}
CUresult cc_memcpyHtoD(const cc_table *t, uintptr_t ctx, CUdeviceptr dst, const void *src, size_t n) {
	ENSURE;
	return t->cuMemcpyHtoD(dst, src, n);
}
CUresult cc_memcpyDtoH(const cc_table *t, uintptr_t ctx, void *dst, CUdeviceptr src, size_t n) {
	ENSURE;
	return t->cuMemcpyDtoH(dst, src, n);
}
CUresult cc_memcpyDtoD(const cc_table *t, uintptr_t ctx, CUdeviceptr dst, CUdeviceptr src, unsigned long long n) {
	ENSURE;
	return t->cuMemcpyDtoD(dst, src, (size_t)n);
}
CUresult cc_memcpyHtoDAsync(const cc_table *t, uintptr_t ctx, CUdeviceptr dst, const void *src, size_t n,
                            uintptr_t s) {
	ENSURE;
	return t->cuMemcpyHtoDAsync(dst, src, n, (CUstream)s);
}
CUresult cc_memcpyDtoHAsync(const cc_table *t, uintptr_t ctx, void *dst, CUdeviceptr src, size_t n, uintptr_t s) {
	ENSURE;
	return t->cuMemcpyDtoHAsync(dst, src, n, (CUstream)s);
}
CUresult cc_memcpyDtoDAsync(const cc_table *t, uintptr_t ctx, CUdeviceptr dst, CUdeviceptr src,
                            unsigned long long n, uintptr_t s) {
	ENSURE;
	return t->cuMemcpyDtoDAsync(dst, src, (size_t)n, (CUstream)s);
}
CUresult cc_memsetD8Async(const cc_table *t, uintptr_t ctx, CUdeviceptr dst, unsigned char v, unsigned long long n,
                          uintptr_t s) {
	ENSURE;
	return t->cuMemsetD8Async(dst, v, (size_t)n, (CUstream)s);
}
CUresult cc_streamCreate(const cc_table *t, uintptr_t ctx, unsigned int flags, int prio, uintptr_t *s) {
	CUstream x = NULL;
	CUresult r;
	ENSURE;
	r = t->cuStreamCreateWithPriority(&x, flags, prio);
	*s = (uintptr_t)x;
	return r;
}
CUresult cc_streamDestroy(const cc_table *t, uintptr_t ctx, uintptr_t s) {
	ENSURE;
	return t->cuStreamDestroy((CUstream)s);
}
CUresult cc_streamSynchronize(const cc_table *t, uintptr_t ctx, uintptr_t s) {
	ENSURE;
	return t->cuStreamSynchronize((CUstream)s);
}
// Draining per-thread default streams at thread exit. The driver destroys a thread's per-thread default
// stream when the thread exits; measured on the H100 (driver 580), stream-ordered pool memory allocated
// or freed on such a stream while copies are in flight can then leave the device waiting for good, and
// every later call of the process blocks. Synchronizing the stream before the thread goes prevents it.
// The drain runs as a thread_local destructor (__cxa_thread_atexit_impl), which glibc runs before the
// destructors of pthread keys, where the driver keeps its per-thread state. A forked child inherits the
// forking thread's list and must not call the driver: the atfork handler empties it there.
#define CC_DRAIN_MAX 16
typedef struct {
	const cc_table *t;
	uintptr_t ctx;
} cc_drain;
static __thread cc_drain cc_drains[CC_DRAIN_MAX];
static __thread int cc_ndrains;
static __thread int cc_drain_armed;

extern int __cxa_thread_atexit_impl(void (*dtor)(void *), void *obj, void *dso);
extern void *__dso_handle;

static void cc_drain_run(void *unused) {
	(void)unused;
	for (int i = 0; i < cc_ndrains; i++) {
		const cc_table *t = cc_drains[i].t;
		uintptr_t ctx = cc_drains[i].ctx;
		if (cc_ensure(t, ctx) == CUDA_SUCCESS) (void)t->cuStreamSynchronize((CUstream)(uintptr_t)0x2); // CU_STREAM_PER_THREAD
	}
	cc_ndrains = 0;
}

static void cc_drain_forget(void) { cc_ndrains = 0; }

static pthread_once_t cc_drain_once = PTHREAD_ONCE_INIT;
static void cc_drain_atfork(void) { (void)pthread_atfork(NULL, NULL, cc_drain_forget); }

int cc_drainPerThreadAtExit(const cc_table *t, uintptr_t ctx) {
	for (int i = 0; i < cc_ndrains; i++) {
		if (cc_drains[i].ctx == ctx) return 0;
	}
	if (cc_ndrains == CC_DRAIN_MAX || ctx == 0) return 1;
	if (!cc_drain_armed) {
		(void)pthread_once(&cc_drain_once, cc_drain_atfork);
		if (__cxa_thread_atexit_impl(cc_drain_run, NULL, &__dso_handle) != 0) return 2;
		cc_drain_armed = 1;
	}
	cc_drains[cc_ndrains].t = t;
	cc_drains[cc_ndrains].ctx = ctx;
	cc_ndrains++;
	return 0;
}

CUresult cc_streamQuery(const cc_table *t, uintptr_t ctx, uintptr_t s) {
	ENSURE;
	return t->cuStreamQuery((CUstream)s);
}
CUresult cc_streamWaitEvent(const cc_table *t, uintptr_t ctx, uintptr_t s, uintptr_t e) {
	ENSURE;
	return t->cuStreamWaitEvent((CUstream)s, (CUevent)e, 0);
}
CUresult cc_streamBeginCapture(const cc_table *t, uintptr_t ctx, uintptr_t s, int mode) {
	ENSURE;
	return t->cuStreamBeginCapture((CUstream)s, mode);
}
CUresult cc_streamEndCapture(const cc_table *t, uintptr_t ctx, uintptr_t s, uintptr_t *g) {
	CUgraph x = NULL;
	CUresult r;
	ENSURE;
	r = t->cuStreamEndCapture((CUstream)s, &x);
	*g = (uintptr_t)x;
	return r;
}
CUresult cc_streamIsCapturing(const cc_table *t, uintptr_t ctx, uintptr_t s, int *status) {
	ENSURE;
	return t->cuStreamIsCapturing((CUstream)s, status);
}
CUresult cc_eventCreate(const cc_table *t, uintptr_t ctx, unsigned int flags, uintptr_t *e) {
	CUevent x = NULL;
	CUresult r;
	ENSURE;
	r = t->cuEventCreate(&x, flags);
	*e = (uintptr_t)x;
	return r;
}
CUresult cc_eventDestroy(const cc_table *t, uintptr_t ctx, uintptr_t e) {
	ENSURE;
	return t->cuEventDestroy((CUevent)e);
}
CUresult cc_eventRecord(const cc_table *t, uintptr_t ctx, uintptr_t e, uintptr_t s) {
	ENSURE;
	return t->cuEventRecord((CUevent)e, (CUstream)s);
}
CUresult cc_eventQuery(const cc_table *t, uintptr_t ctx, uintptr_t e) {
	ENSURE;
	return t->cuEventQuery((CUevent)e);
}
CUresult cc_eventSynchronize(const cc_table *t, uintptr_t ctx, uintptr_t e) {
	ENSURE;
	return t->cuEventSynchronize((CUevent)e);
}
CUresult cc_eventElapsedTime(const cc_table *t, uintptr_t ctx, uintptr_t start, uintptr_t end, float *ms) {
	ENSURE;
	return t->cuEventElapsedTime(ms, (CUevent)start, (CUevent)end);
}
CUresult cc_graphInstantiate(const cc_table *t, uintptr_t ctx, uintptr_t g, uintptr_t *exec) {
	CUgraphExec x = NULL;
	CUresult r;
	NEED(cuGraphInstantiateWithFlags);
	ENSURE;
	r = t->cuGraphInstantiateWithFlags(&x, (CUgraph)g, 0);
	*exec = (uintptr_t)x;
	return r;
}
CUresult cc_graphUpload(const cc_table *t, uintptr_t ctx, uintptr_t exec, uintptr_t s) {
	ENSURE;
	return t->cuGraphUpload((CUgraphExec)exec, (CUstream)s);
}
CUresult cc_graphLaunch(const cc_table *t, uintptr_t ctx, uintptr_t exec, uintptr_t s) {
	ENSURE;
	return t->cuGraphLaunch((CUgraphExec)exec, (CUstream)s);
}
CUresult cc_deviceGraphMemTrim(const cc_table *t, uintptr_t ctx, int dev) {
	NEED(cuDeviceGraphMemTrim);
	ENSURE;
	return t->cuDeviceGraphMemTrim((CUdevice)dev);
}
CUresult cc_graphExecUpdate(const cc_table *t, uintptr_t ctx, uintptr_t exec, uintptr_t g, int *updateResult) {
	CUgraphExecUpdateResultInfo info;
	CUresult r;
	NEED(cuGraphExecUpdate);
	ENSURE;
	memset(&info, 0, sizeof info);
	r = t->cuGraphExecUpdate((CUgraphExec)exec, (CUgraph)g, &info);
	*updateResult = info.result;
	return r;
}
CUresult cc_graphExecDestroy(const cc_table *t, uintptr_t ctx, uintptr_t exec) {
	ENSURE;
	return t->cuGraphExecDestroy((CUgraphExec)exec);
}
CUresult cc_graphDestroy(const cc_table *t, uintptr_t ctx, uintptr_t g) {
	ENSURE;
	return t->cuGraphDestroy((CUgraph)g);
}
CUresult cc_graphNodeCount(const cc_table *t, uintptr_t ctx, uintptr_t g, unsigned long long *n) {
	size_t x = 0;
	CUresult r;
	ENSURE;
	r = t->cuGraphGetNodes((CUgraph)g, NULL, &x); // nodes == NULL: the driver only writes the count
	*n = x;
	return r;
}
CUresult cc_graphDebugDotPrint(const cc_table *t, uintptr_t ctx, uintptr_t g, const char *path, unsigned int flags) {
	NEED(cuGraphDebugDotPrint);
	ENSURE;
	return t->cuGraphDebugDotPrint((CUgraph)g, path, flags);
}
CUresult cc_moduleLoadData(const cc_table *t, uintptr_t ctx, const void *image, uintptr_t *mod) {
	CUmodule m = NULL;
	CUresult r;
	ENSURE;
	r = t->cuModuleLoadData(&m, image);
	*mod = (uintptr_t)m;
	return r;
}
CUresult cc_moduleUnload(const cc_table *t, uintptr_t ctx, uintptr_t mod) {
	ENSURE;
	return t->cuModuleUnload((CUmodule)mod);
}
CUresult cc_moduleGetFunction(const cc_table *t, uintptr_t ctx, uintptr_t mod, const char *name, uintptr_t *fn) {
	CUfunction f = NULL;
	CUresult r;
	ENSURE;
	r = t->cuModuleGetFunction(&f, (CUmodule)mod, name);
	*fn = (uintptr_t)f;
	return r;
}
CUresult cc_funcGetAttribute(const cc_table *t, uintptr_t ctx, uintptr_t fn, int attr, int *v) {
	ENSURE;
	return t->cuFuncGetAttribute(v, attr, (CUfunction)fn);
}
CUresult cc_launchKernel(const cc_table *t, uintptr_t ctx, uintptr_t fn, const unsigned int *grid,
                         const unsigned int *block, unsigned int shared, uintptr_t s, void **params) {
	ENSURE;
	return t->cuLaunchKernel((CUfunction)fn, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared,
	                         (CUstream)s, params, NULL);
}

// ---- several devices and processes ------------------------------------------------------------------

_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc must match cuda.h (12 bytes)");
_Static_assert(sizeof(CUipcMemHandle) == 64, "CUipcMemHandle is 64 bytes");
_Static_assert(sizeof(CUipcEventHandle) == 64, "CUipcEventHandle is 64 bytes");
_Static_assert(sizeof(CUmemPoolPtrExportData) == 64, "CUmemPoolPtrExportData is 64 bytes");

CUresult cc_deviceCanAccessPeer(const cc_table *t, int dev, int peer, int *can) {
	return t->cuDeviceCanAccessPeer(can, dev, peer);
}
// A device attribute: no context is made current, so it can be read for devices no context was made for.
CUresult cc_deviceGetP2PAttribute(const cc_table *t, int attr, int src, int dst, int *v) {
	return t->cuDeviceGetP2PAttribute(v, attr, src, dst);
}
// The attributes read are an int or an unsigned long long: v starts zeroed, so an int attribute (written to
// its low half on a little-endian machine, the only kind cudacore builds for) reads back as its value.
CUresult cc_pointerGetAttribute(const cc_table *t, uintptr_t ctx, int attr, CUdeviceptr p, unsigned long long *v) {
	ENSURE;
	*v = 0;
	return t->cuPointerGetAttribute(v, attr, p);
}
CUresult cc_memRetainAllocationHandle(const cc_table *t, uintptr_t ctx, CUdeviceptr p, unsigned long long *h) {
	ENSURE;
	NEED(cuMemRetainAllocationHandle);
	return t->cuMemRetainAllocationHandle(h, (void *)(uintptr_t)p);
}
CUresult cc_memRelease(const cc_table *t, uintptr_t ctx, unsigned long long h) {
	ENSURE;
	NEED(cuMemRelease);
	return t->cuMemRelease(h);
}
CUresult cc_ctxEnablePeerAccess(const cc_table *t, uintptr_t ctx, uintptr_t peer) {
	ENSURE;
	return t->cuCtxEnablePeerAccess((CUcontext)peer, 0);
}
CUresult cc_memcpyPeerAsync(const cc_table *t, uintptr_t ctx, CUdeviceptr dst, uintptr_t dstCtx, CUdeviceptr src,
                            uintptr_t srcCtx, unsigned long long n, uintptr_t s) {
	ENSURE;
	return t->cuMemcpyPeerAsync(dst, (CUcontext)dstCtx, src, (CUcontext)srcCtx, (size_t)n, (CUstream)s);
}
CUresult cc_memPoolSetAccess(const cc_table *t, uintptr_t ctx, uintptr_t pool, int dev, int flags) {
	CUmemAccessDesc d;
	ENSURE;
	memset(&d, 0, sizeof d);
	d.location.type = 1; // CU_MEM_LOCATION_TYPE_DEVICE
	d.location.id = dev;
	d.flags = flags;
	return t->cuMemPoolSetAccess((CUmemoryPool)pool, &d, 1);
}
CUresult cc_memPoolGetAccess(const cc_table *t, uintptr_t ctx, uintptr_t pool, int dev, int *flags) {
	struct {
		int type;
		int id;
	} loc = {1, dev};
	ENSURE;
	return t->cuMemPoolGetAccess(flags, (CUmemoryPool)pool, &loc);
}
CUresult cc_memPoolExportToShareableHandle(const cc_table *t, uintptr_t ctx, uintptr_t pool, int handleType, int *fd) {
	ENSURE;
	// For CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR the handle written is an int.
	return t->cuMemPoolExportToShareableHandle(fd, (CUmemoryPool)pool, handleType, 0);
}
CUresult cc_memPoolImportFromShareableHandle(const cc_table *t, uintptr_t ctx, int fd, int handleType,
                                             uintptr_t *pool) {
	CUmemoryPool p = NULL;
	CUresult r;
	ENSURE;
	// A POSIX file descriptor is passed as the handle's value, cast to a pointer (cuda.h documents this).
	r = t->cuMemPoolImportFromShareableHandle(&p, (void *)(intptr_t)fd, handleType, 0);
	*pool = (uintptr_t)p;
	return r;
}
CUresult cc_memPoolExportPointer(const cc_table *t, uintptr_t ctx, CUdeviceptr p, unsigned char *out64) {
	CUmemPoolPtrExportData d;
	CUresult r;
	ENSURE;
	memset(&d, 0, sizeof d);
	r = t->cuMemPoolExportPointer(&d, p);
	memcpy(out64, &d, sizeof d);
	return r;
}
CUresult cc_memPoolImportPointer(const cc_table *t, uintptr_t ctx, uintptr_t pool, const unsigned char *data64,
                                 CUdeviceptr *p) {
	CUmemPoolPtrExportData d;
	ENSURE;
	memcpy(&d, data64, sizeof d);
	return t->cuMemPoolImportPointer(p, (CUmemoryPool)pool, &d);
}
CUresult cc_ipcGetMemHandle(const cc_table *t, uintptr_t ctx, CUdeviceptr p, unsigned char *out64) {
	CUipcMemHandle h;
	CUresult r;
	ENSURE;
	memset(&h, 0, sizeof h);
	r = t->cuIpcGetMemHandle(&h, p);
	memcpy(out64, &h, sizeof h);
	return r;
}
CUresult cc_ipcOpenMemHandle(const cc_table *t, uintptr_t ctx, const unsigned char *h64, unsigned int flags,
                             CUdeviceptr *p) {
	CUipcMemHandle h;
	ENSURE;
	memcpy(&h, h64, sizeof h);
	return t->cuIpcOpenMemHandle(p, h, flags);
}
CUresult cc_ipcCloseMemHandle(const cc_table *t, uintptr_t ctx, CUdeviceptr p) {
	ENSURE;
	return t->cuIpcCloseMemHandle(p);
}
CUresult cc_ipcGetEventHandle(const cc_table *t, uintptr_t ctx, uintptr_t e, unsigned char *out64) {
	CUipcEventHandle h;
	CUresult r;
	ENSURE;
	memset(&h, 0, sizeof h);
	r = t->cuIpcGetEventHandle(&h, (CUevent)e);
	memcpy(out64, &h, sizeof h);
	return r;
}
CUresult cc_ipcOpenEventHandle(const cc_table *t, uintptr_t ctx, const unsigned char *h64, uintptr_t *e) {
	CUipcEventHandle h;
	CUevent ev = NULL;
	CUresult r;
	ENSURE;
	memcpy(&h, h64, sizeof h);
	r = t->cuIpcOpenEventHandle(&ev, h);
	*e = (uintptr_t)ev;
	return r;
}
