package libcuda

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// asError returns err's *cuda.Error, failing the test when there is none.
func asError(t *testing.T, err error) *cuda.Error {
	t.Helper()
	var e *cuda.Error
	require.ErrorAs(t, err, &e)
	return e
}

func TestOpenFailures(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "no-such-libcuda.so.1")
	text := filepath.Join(dir, "libcuda-text.so")
	require.NoError(t, os.WriteFile(text, []byte("this is not a shared library\n"), 0o644))
	empty := filepath.Join(dir, "libcuda-empty.so")
	require.NoError(t, os.WriteFile(empty, nil, 0o644))

	tests := []struct {
		name, path, op string
		contains       []string
	}{
		{"missing file", missing, "dlopen", []string{missing, "CUDACORE_LIBCUDA", "CUDACORE_BACKEND=sim"}},
		{"text file", text, "dlopen", []string{text, "CUDACORE_BACKEND=sim"}},
		{"empty file", empty, "dlopen", []string{empty}},
		{"not a CUDA driver", "libc.so.6", "dlsym", []string{"libc.so.6", "cuInit", "not a CUDA driver"}},
		{"bare name not on the search path", "libcuda-definitely-absent.so.9", "dlopen", []string{"libcuda-definitely-absent.so.9"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Open(tc.path)
			require.Error(t, err)
			assert.Nil(t, d)
			assert.ErrorIs(t, err, cuda.ErrDriverNotFound)
			e := asError(t, err)
			assert.Equal(t, cuda.ErrorDriverNotFound, e.Result)
			assert.Equal(t, tc.op, e.Op)
			for _, s := range tc.contains {
				assert.Contains(t, err.Error(), s)
			}
		})
	}
}

func TestOpenNotCUDANamesSymbolField(t *testing.T) {
	_, err := Open("libc.so.6")
	e := asError(t, err)
	v, ok := e.Field("symbol")
	assert.True(t, ok)
	assert.Equal(t, "cuInit", v)
	// Every other required entry point is missing too; the message says how many without listing them.
	assert.Contains(t, err.Error(), "other required entry points")
}

func TestOpenConcurrent(t *testing.T) {
	fake := buildFake(t, nil)
	const n = 32
	var wg sync.WaitGroup
	drivers := make([]*Driver, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch i % 4 {
			case 0:
				_, errs[i] = Open(filepath.Join(os.TempDir(), "cudacore-absent", "libcuda.so.1"))
			case 1:
				_, errs[i] = Open("libc.so.6")
			default:
				drivers[i], errs[i] = Open(fake)
			}
		}()
	}
	wg.Wait()
	var first *Driver
	for i := range n {
		if i%4 < 2 {
			assert.ErrorIs(t, errs[i], cuda.ErrDriverNotFound, "goroutine %d", i)
			continue
		}
		require.NoError(t, errs[i], "goroutine %d", i)
		if first == nil {
			first = drivers[i]
		}
		assert.Same(t, first, drivers[i], "the same path must give the same *Driver")
	}
	v, err := first.Version()
	require.NoError(t, err)
	assert.Equal(t, 13000, v)
}

func TestBindingsMatchTable(t *testing.T) {
	fields, entries := tableFields()
	require.Equal(t, len(bindings), entries, "cc_table and bindings differ in length")
	require.Len(t, fields, len(bindings))
	seen := map[string]bool{}
	for i, b := range bindings {
		assert.Equal(t, fields[i], b.field, "binding %d", i)
		require.NotEmpty(t, b.names, b.field)
		for _, n := range b.names {
			assert.True(t, strings.HasPrefix(n, b.field), "%s binds %s", b.field, n)
			assert.False(t, strings.HasSuffix(n, "_ptsz") || strings.HasSuffix(n, "_ptds"), n)
			assert.False(t, seen[n], "%s bound twice", n)
			seen[n] = true
		}
		if b.optional {
			assert.NotEmpty(t, b.since, b.field)
		}
	}
	// The entry point that crashed the first prototype must never be looked up under a name that does not exist.
	assert.Equal(t, []string{"cuDevicePrimaryCtxRetain"}, bindings[symDevicePrimaryCtxRetain].names)
}

// TestCgoDirectives checks that every wrapper that calls the driver is declared noescape and nocallback:
// a missing one would silently put the hot paths' out-parameters on the heap.
func TestCgoDirectives(t *testing.T) {
	hdr, err := os.ReadFile("shim.h")
	require.NoError(t, err)
	src, err := os.ReadFile("libcuda.go")
	require.NoError(t, err)
	loaders := map[string]bool{"cc_dlopen": true, "cc_dlsym": true, "cc_dlclose": true, "cc_table_new": true,
		"cc_table_set": true, "cc_table_get": true, "cc_table_len": true, "cc_mempoolprops_size": true}
	n := 0
	for _, m := range regexp.MustCompile(`\b(cc_\w+)\(`).FindAllStringSubmatch(string(hdr), -1) {
		if loaders[m[1]] {
			continue
		}
		n++
		assert.Contains(t, string(src), "#cgo noescape "+m[1]+"\n")
		assert.Contains(t, string(src), "#cgo nocallback "+m[1]+"\n")
	}
	assert.Greater(t, n, 60)
}

// ---- the fake driver -------------------------------------------------------------------------------

// fakeBodies are the fake driver's canned entry points, by exported name. Everything else the binding table
// names is exported as a stub returning 999 (CUDA_ERROR_UNKNOWN), so Open binds the whole table.
var fakeBodies = map[string]string{
	"cuInit":              `int cuInit(unsigned f) { return f == 0 ? 0 : 1; }`,
	"cuDriverGetVersion":  `int cuDriverGetVersion(int *v) { *v = 13000; return 0; }`,
	"cuDeviceGetCount":    `int cuDeviceGetCount(int *n) { *n = 2; return 0; }`,
	"cuDeviceGet":         `int cuDeviceGet(int *d, int o) { if (o < 0 || o >= 2) return 101; *d = o; return 0; }`,
	"cuDeviceGetName":     `int cuDeviceGetName(char *b, int n, int d) { snprintf(b, n, "Fake GPU %d", d); return 0; }`,
	"cuDeviceGetUuid_v2":  `int cuDeviceGetUuid_v2(CUuuid *u, int d) { for (int i = 0; i < 16; i++) u->bytes[i] = i + d; return 0; }`,
	"cuDeviceTotalMem_v2": `int cuDeviceTotalMem_v2(size_t *b, int d) { *b = 80ULL << 30; return 0; }`,
	"cuDevicePrimaryCtxRetain": `int cuDevicePrimaryCtxRetain(void **c, int d) {
		if (d < 0 || d >= 2) return 101; *c = (void *)(uintptr_t)(0xC0 + d); return 0; }`,
	"cuCtxGetCurrent": `int cuCtxGetCurrent(void **c) { *c = cur; return 0; }`,
	// 0xBAD stands for a destroyed context.
	"cuCtxSetCurrent": `int cuCtxSetCurrent(void *c) {
		__atomic_add_fetch(&setcalls, 1, __ATOMIC_SEQ_CST);
		if (c == (void *)0xBAD) return 201; cur = c; return 0; }`,
	// Limit 6 reads back the number of cuCtxSetCurrent calls so far; any other the current context.
	"cuCtxGetLimit": `int cuCtxGetLimit(size_t *v, int l) {
		*v = l == 6 ? (size_t)__atomic_load_n(&setcalls, __ATOMIC_SEQ_CST) : (size_t)(uintptr_t)cur; return 0; }`,
	"cuMemGetInfo_v2": `int cuMemGetInfo_v2(size_t *f, size_t *t) { *f = 1ULL << 30; *t = 2ULL << 30; return 0; }`,
	"cuMemAlloc_v2":   `int cuMemAlloc_v2(CUdeviceptr *p, size_t n) { return 2; }`,
	// The pointer encodes the context current during the call and the stream, to prove both arrived.
	"cuMemAllocAsync": `int cuMemAllocAsync(CUdeviceptr *p, size_t n, void *s) {
		if (n != 4096) return 1; *p = ((uintptr_t)cur << 16) | (uintptr_t)s; return 0; }`,
	"cuMemFreeAsync": `int cuMemFreeAsync(CUdeviceptr p, void *s) {
		return p == (((uintptr_t)cur << 16) | (uintptr_t)s) ? 0 : 400; }`,
	"cuMemAllocFromPoolAsync": `int cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, void *pool, void *s) {
		*p = (uintptr_t)pool + n; return 0; }`,
	// A pool with handle type 1 (POSIX file descriptors) is 0xB01, one without 0xB00; a maximum size of n
	// MiB adds n << 12.
	"cuMemPoolCreate": `int cuMemPoolCreate(void **pool, const CUmemPoolProps *pp) {
		static const unsigned char zero[54];
		if (pp->allocType != 1 || (pp->handleTypes != 0 && pp->handleTypes != 1) || pp->location.type != 1 ||
		    pp->location.id != 1 || pp->win32SecurityAttributes != NULL || pp->maxSize % (1 << 20) != 0 ||
		    pp->usage != 0 || memcmp(pp->reserved, zero, sizeof zero) != 0) return 1;
		*pool = (void *)(uintptr_t)(0xB00 + pp->handleTypes + ((pp->maxSize >> 20) << 12)); return 0; }`,
	// Device d's default pool is 0xD0 + d; 0xB02 (an imported pool) cannot be made current.
	"cuDeviceGetMemPool": `int cuDeviceGetMemPool(void **p, int d) {
		if (d < 0 || d >= 2) return 101; *p = curpool[d] ? curpool[d] : (void *)(uintptr_t)(0xD0 + d); return 0; }`,
	"cuDeviceSetMemPool": `int cuDeviceSetMemPool(int d, void *p) {
		if (d < 0 || d >= 2) return 101; if (p == (void *)0xB02) return 1; curpool[d] = p; return 0; }`,
	// Several devices and processes: each canned body checks what arrived and answers in a recognizable way.
	"cuDeviceCanAccessPeer": `int cuDeviceCanAccessPeer(int *c, int d, int p) {
		if (d < 0 || d >= 2 || p < 0 || p >= 2) return 101; *c = d != p; return 0; }`,
	"cuDeviceGetP2PAttribute": `int cuDeviceGetP2PAttribute(int *v, int attr, int s, int d) {
		if (s < 0 || s >= 2 || d < 0 || d >= 2 || s == d) return 101; *v = attr * 10 + s; return 0; }`,
	"cuPointerGetAttribute": `int cuPointerGetAttribute(void *v, int attr, CUdeviceptr p) {
		if (cur != (void *)0xC0 || p < BASE || p >= BASE + sizeof devmem) return 1;
		if (attr == 10) { *(int *)v = 1; return 0; }
		if (attr == 14) { *(unsigned long long *)v = 0x100000001ULL; return 0; }
		return 1; }`,
	"cuMemRetainAllocationHandle": `int cuMemRetainAllocationHandle(unsigned long long *h, void *p) {
		if (cur != (void *)0xC0 || (CUdeviceptr)p != BASE) return 1; *h = 0xABC; return 0; }`,
	"cuMemRelease": `int cuMemRelease(unsigned long long h) { return h == 0xABC ? 0 : 1; }`,
	"cuCtxEnablePeerAccess": `int cuCtxEnablePeerAccess(void *peer, unsigned f) {
		return cur == (void *)0xC0 && peer == (void *)0xC1 && f == 0 ? 0 : 704; }`,
	"cuMemcpyPeerAsync": `int cuMemcpyPeerAsync(CUdeviceptr d, void *dc, CUdeviceptr s, void *sc, size_t n, void *st) {
		if (cur != (void *)0xC1 || dc != (void *)0xC1 || sc != (void *)0xC0 || st != (void *)0x55) return 1;
		if (d < BASE || s < BASE || d + n > BASE + sizeof devmem || s + n > BASE + sizeof devmem) return 1;
		memmove(devmem + (d - BASE), devmem + (s - BASE), n); return 0; }`,
	"cuMemPoolSetAccess": `int cuMemPoolSetAccess(void *pool, const CUmemAccessDesc *a, size_t n) {
		return pool == (void *)0xB00 && n == 1 && a->location.type == 1 && a->location.id == 1 && a->flags == 3 ? 0 : 1; }`,
	"cuMemPoolGetAccess": `int cuMemPoolGetAccess(int *f, void *pool, void *loc) {
		const int *l = loc; if (l[0] != 1) return 1; *f = l[1] == 1 ? 3 : 0; return 0; }`,
	"cuMemPoolExportToShareableHandle": `int cuMemPoolExportToShareableHandle(void *h, void *pool, int t, unsigned long long f) {
		if (pool != (void *)0xB01 || t != 1 || f != 0) return 1; *(int *)h = 42; return 0; }`,
	"cuMemPoolImportFromShareableHandle": `int cuMemPoolImportFromShareableHandle(void **pool, void *h, int t, unsigned long long f) {
		if ((intptr_t)h != 42 || t != 1 || f != 0) return 1; *pool = (void *)0xB02; return 0; }`,
	"cuMemPoolExportPointer": `int cuMemPoolExportPointer(CUmemPoolPtrExportData *d, CUdeviceptr p) {
		for (int i = 0; i < 64; i++) d->reserved[i] = (unsigned char)(p + i); return 0; }`,
	"cuMemPoolImportPointer": `int cuMemPoolImportPointer(CUdeviceptr *p, void *pool, CUmemPoolPtrExportData *d) {
		if (pool != (void *)0xB02) return 1;
		for (int i = 0; i < 64; i++) if (d->reserved[i] != (unsigned char)(i * 3)) return 1;
		*p = 0x1234; return 0; }`,
	"cuIpcGetMemHandle": `int cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
		for (int i = 0; i < 64; i++) h->reserved[i] = (char)(i ^ (int)p); return 0; }`,
	"cuIpcOpenMemHandle_v2": `int cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned f) {
		if (f != 1) return 1; for (int i = 0; i < 64; i++) if (h.reserved[i] != (char)(i * 5)) return 1;
		*p = 0x5678; return 0; }`,
	"cuIpcCloseMemHandle": `int cuIpcCloseMemHandle(CUdeviceptr p) { return p == 0x5678 ? 0 : 1; }`,
	"cuIpcGetEventHandle": `int cuIpcGetEventHandle(CUipcEventHandle *h, void *e) {
		for (int i = 0; i < 64; i++) h->reserved[i] = (char)((uintptr_t)e + i); return 0; }`,
	"cuIpcOpenEventHandle": `int cuIpcOpenEventHandle(void **e, CUipcEventHandle h) {
		for (int i = 0; i < 64; i++) if (h.reserved[i] != (char)(100 - i)) return 1; *e = (void *)0xE0; return 0; }`,
	"cuMemcpyHtoD_v2": `int cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) {
		if (d < BASE || d + n > BASE + sizeof devmem) return 1; memcpy(devmem + (d - BASE), s, n); return 0; }`,
	"cuMemcpyDtoH_v2": `int cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) {
		if (s < BASE || s + n > BASE + sizeof devmem) return 1; memcpy(d, devmem + (s - BASE), n); return 0; }`,
	"cuStreamQuery":       `int cuStreamQuery(void *s) { return s == (void *)1 ? 0 : 600; }`,
	"cuStreamSynchronize": `int cuStreamSynchronize(void *s) { return 12345; }`,
	"cuEventElapsedTime":  `int cuEventElapsedTime(float *ms, void *a, void *b) { *ms = 1.5f; return 0; }`,
	"cuGraphGetNodes":     `int cuGraphGetNodes(void *g, void **nodes, size_t *n) { if (nodes) return 1; *n = 7; return 0; }`,
	"cuGraphDebugDotPrint": `int cuGraphDebugDotPrint(void *g, const char *path, unsigned flags) {
		FILE *f = fopen(path, "w"); if (!f) return 304;
		fprintf(f, "digraph g%p flags %u\n", g, flags); fclose(f); return 0; }`,
	"cuGetErrorName": `int cuGetErrorName(int r, const char **s) {
		if (r != 12345) return 1; *s = "CUDA_ERROR_FAKE_FROM_THE_FUTURE"; return 0; }`,
	"cuLaunchKernel": `int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
		unsigned bz, unsigned sh, void *s, void **params, void **extra) {
		int ok = f == (void *)0xF00 && gx == 3 && gy == 1 && gz == 1 && bx == 128 && by == 2 && bz == 1 &&
		         sh == 64 && s == (void *)2 && extra == NULL && params != NULL &&
		         *(int *)params[0] == 42 && *(double *)params[1] == 1.5 && *(char *)params[2] == 'x' &&
		         ((uintptr_t)params[1] % 8) == 0;
		return ok ? 0 : 1; }`,
}

const fakePrelude = `#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "shim.h"
static __thread void *cur; /* the calling thread's current context */
static int setcalls;       /* cuCtxSetCurrent calls, all threads */
#define BASE 0x100000ULL   /* "device memory": a CUdeviceptr is BASE + an offset into devmem */
static unsigned char devmem[1 << 16];
static void *curpool[2];   /* cuDeviceSetMemPool's pools, by device; NULL: the default pool */
`

// fakeSource generates the fake driver from the binding table, so it can never lag behind it: for each
// binding it exports the first name not in omit, canned if fakeBodies has it, a stub otherwise.
func fakeSource(omit map[string]bool) (string, []string) {
	var b strings.Builder
	b.WriteString(fakePrelude)
	var exported []string
	for _, bd := range bindings {
		for _, name := range bd.names {
			if omit[name] {
				continue
			}
			exported = append(exported, name)
			if body, ok := fakeBodies[name]; ok {
				b.WriteString(body + "\n")
			} else {
				fmt.Fprintf(&b, "int %s(void) { return 999; }\n", name)
			}
			break
		}
	}
	return b.String(), exported
}

// defaultOmit leaves out the newer names that have a fallback, and one optional entry point.
var defaultOmit = map[string]bool{
	"cuEventElapsedTime_v2": true, // falls back to cuEventElapsedTime
	"cuGraphGetNodes_v2":    true, // falls back to cuGraphGetNodes
	"cuGraphExecUpdate_v2":  true, // optional: GraphExecUpdate returns ErrorNotSupported
}

// buildFake compiles the fake driver into a temporary directory and returns its path; it skips the test
// when there is no C compiler.
func buildFake(t *testing.T, omit map[string]bool) string {
	t.Helper()
	if omit == nil {
		omit = defaultOmit
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler (%s) to build the fake driver", cc)
	}
	src, _ := fakeSource(omit)
	dir := t.TempDir()
	cfile := filepath.Join(dir, "fakecuda.c")
	lib := filepath.Join(dir, "libfakecuda.so")
	require.NoError(t, os.WriteFile(cfile, []byte(src), 0o644))
	wd, err := os.Getwd()
	require.NoError(t, err)
	out, err := exec.Command(cc, "-std=gnu11", "-Wall", "-Wno-unused-variable", "-shared", "-fPIC",
		"-I", wd, "-o", lib, cfile).CombinedOutput()
	require.NoError(t, err, "building the fake driver:\n%s", out)
	return lib
}

func TestFakeSourceUsesEveryCannedBody(t *testing.T) {
	_, exported := fakeSource(defaultOmit)
	set := map[string]bool{}
	for _, n := range exported {
		set[n] = true
	}
	var unused []string
	for n := range fakeBodies {
		if !set[n] {
			unused = append(unused, n)
		}
	}
	sort.Strings(unused)
	assert.Empty(t, unused, "canned bodies for names the binding table does not export")
}

func openFake(t *testing.T) (*Driver, cuda.Context) {
	t.Helper()
	d, err := Open(buildFake(t, nil))
	require.NoError(t, err)
	require.NoError(t, d.Init())
	ctx, err := d.PrimaryCtxRetain(0)
	require.NoError(t, err)
	return d, ctx
}

func TestFakeDriver(t *testing.T) {
	d, ctx := openFake(t)

	v, err := d.Version()
	require.NoError(t, err)
	assert.Equal(t, 13000, v)
	n, err := d.DeviceCount()
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	dev, err := d.DeviceGet(1)
	require.NoError(t, err)
	assert.Equal(t, cuda.Device(1), dev)
	_, err = d.DeviceGet(5)
	assert.ErrorIs(t, err, cuda.ErrInvalidDevice)
	name, err := d.DeviceName(1)
	require.NoError(t, err)
	assert.Equal(t, "Fake GPU 1", name)
	uuid, err := d.DeviceUUID(1)
	require.NoError(t, err)
	assert.Equal(t, [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, uuid)
	total, err := d.DeviceTotalMem(0)
	require.NoError(t, err)
	assert.Equal(t, uint64(80<<30), total)
	free, total, err := d.MemGetInfo(ctx)
	require.NoError(t, err)
	assert.Equal(t, []uint64{1 << 30, 2 << 30}, []uint64{free, total})

	// The versioned names were bound where they exist, the fallbacks where they do not.
	assert.Equal(t, "cuMemAlloc_v2", d.Bound("cuMemAlloc"))
	assert.Equal(t, "cuDevicePrimaryCtxRetain", d.Bound("cuDevicePrimaryCtxRetain"))
	assert.Equal(t, "cuDevicePrimaryCtxRelease_v2", d.Bound("cuDevicePrimaryCtxRelease"))
	assert.Equal(t, "cuEventElapsedTime", d.Bound("cuEventElapsedTime"))
	assert.Equal(t, "cuGraphGetNodes", d.Bound("cuGraphGetNodes"))
	assert.Equal(t, "", d.Bound("cuGraphExecUpdate"))

	ms, err := d.EventElapsedTime(ctx, 0x10, 0x11)
	require.NoError(t, err)
	assert.Equal(t, float32(1.5), ms)
	nodes, err := d.GraphNodeCount(ctx, 0x20)
	require.NoError(t, err)
	assert.Equal(t, 7, nodes)

	// The path reaches the driver as a C string and verbose as CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE.
	dot := filepath.Join(t.TempDir(), "g.dot")
	require.NoError(t, d.GraphDebugDot(ctx, 0x20, dot, true))
	text, err := os.ReadFile(dot)
	require.NoError(t, err)
	assert.Equal(t, "digraph g0x20 flags 1\n", string(text))
	require.NoError(t, d.GraphDebugDot(ctx, 0x20, dot, false))
	text, _ = os.ReadFile(dot)
	assert.Equal(t, "digraph g0x20 flags 0\n", string(text))
	err = d.GraphDebugDot(ctx, 0x20, filepath.Join(dot, "under-a-file.dot"), false)
	assert.ErrorIs(t, err, cuda.ErrUnknown)
	assert.Contains(t, err.Error(), "CUDA_ERROR_OPERATING_SYSTEM")
}

func TestFakeErrors(t *testing.T) {
	d, ctx := openFake(t)
	tests := []struct {
		name   string
		call   func() error
		target error
		result cuda.Result
		op     string
		msg    string
	}{
		{"out of memory", func() error { _, err := d.MemAlloc(ctx, 1<<40); return err },
			cuda.ErrOutOfMemory, cuda.ErrorOutOfMemory, "cuMemAlloc_v2", ""},
		{"stub entry point", func() error { _, err := d.MemAllocManaged(ctx, 1, cuda.MemAttachGlobal); return err },
			cuda.ErrUnknown, cuda.ErrorUnknown, "cuMemAllocManaged", ""},
		{"stream not ready", func() error { return d.StreamQuery(ctx, 0x77) },
			cuda.ErrNotReady, cuda.ErrorNotReady, "cuStreamQuery", ""},
		{"optional entry point absent", func() error { return d.GraphExecUpdate(ctx, 1, 2) },
			cuda.ErrNotSupported, cuda.ErrorNotSupported, "cuGraphExecUpdate_v2", "CUDA 12.0"},
		{"no context", func() error { _, err := d.MemAllocAsync(0, 4096, 0); return err },
			cuda.ErrInvalidHandle, cuda.ErrorInvalidContext, "cuMemAllocAsync", "Context 0"},
		{"context cannot be made current", func() error { _, err := d.MemAllocAsync(0xBAD, 4096, 0); return err },
			cuda.ErrInvalidHandle, cuda.ErrorInvalidContext, "cuCtxSetCurrent", "before cuMemAllocAsync"},
		{"code newer than the table", func() error { return d.StreamSynchronize(ctx, 1) },
			cuda.ErrUnknown, cuda.Result(12345), "cuStreamSynchronize", "CUDA_ERROR_FAKE_FROM_THE_FUTURE"},
		{"empty module image", func() error { _, err := d.ModuleLoadData(ctx, nil); return err },
			cuda.ErrInvalidValue, cuda.ErrorInvalidValue, "cuModuleLoadData", "empty"},
		{"copy out of range", func() error { return d.MemcpyHtoD(ctx, 0x10, []byte{1}) },
			cuda.ErrInvalidValue, cuda.ErrorInvalidValue, "cuMemcpyHtoD_v2", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			require.Error(t, err)
			assert.ErrorIs(t, err, tc.target)
			e := asError(t, err)
			assert.Equal(t, tc.result, e.Result)
			assert.Equal(t, tc.op, e.Op)
			assert.Contains(t, e.Msg, tc.msg)
		})
	}
	assert.NoError(t, d.StreamQuery(ctx, cuda.StreamLegacy))
}

func TestFakeMemory(t *testing.T) {
	d, ctx := openFake(t)

	// The pointer encodes (current context << 16 | stream): the context was current during the call and
	// the special stream handles passed through unchanged.
	for _, s := range []cuda.Stream{0, cuda.StreamLegacy, cuda.StreamPerThread, 0x55} {
		p, err := d.MemAllocAsync(ctx, 4096, s)
		require.NoError(t, err)
		assert.Equal(t, cuda.DevicePtr(uint64(ctx)<<16|uint64(s)), p, "stream %#x", s)
		require.NoError(t, d.MemFreeAsync(ctx, p, s))
	}
	p, err := d.MemAllocFromPoolAsync(ctx, 100, 0xB00, cuda.StreamPerThread)
	require.NoError(t, err)
	assert.Equal(t, cuda.DevicePtr(0xB00+100), p)

	pool, err := d.MemPoolCreate(ctx, cuda.PoolProps{Device: 1})
	require.NoError(t, err, "the fake checks every CUmemPoolProps field")
	assert.Equal(t, cuda.MemPool(0xB00), pool)
	pool, err = d.MemPoolCreate(ctx, cuda.PoolProps{Device: 1, MaxSize: 64 << 20})
	require.NoError(t, err, "maxSize arrives in its field")
	assert.Equal(t, cuda.MemPool(0xB00+64<<12), pool)

	// The current pool: the default one until set, per device; an imported pool is refused.
	cur, err := d.DeviceGetMemPool(1)
	require.NoError(t, err)
	assert.Equal(t, cuda.MemPool(0xD1), cur)
	require.NoError(t, d.DeviceSetMemPool(1, pool))
	cur, err = d.DeviceGetMemPool(1)
	require.NoError(t, err)
	assert.Equal(t, pool, cur)
	cur, err = d.DeviceGetMemPool(0)
	require.NoError(t, err)
	assert.Equal(t, cuda.MemPool(0xD0), cur, "another device's current pool is its own")
	err = d.DeviceSetMemPool(1, 0xB02)
	assert.ErrorIs(t, err, cuda.ErrInvalidValue)
	assert.Equal(t, "cuDeviceSetMemPool", asError(t, err).Op)
	_, err = d.DeviceGetMemPool(7)
	assert.Equal(t, cuda.ErrorInvalidDevice, cuda.ResultOf(err))
	require.NoError(t, d.DeviceSetMemPool(1, 0xD1))

	// Copy round trip through the fake's device memory.
	const base = cuda.DevicePtr(0x100000)
	src := []byte("round trip through the fake driver")
	require.NoError(t, d.MemcpyHtoD(ctx, base+8, src))
	dst := make([]byte, len(src))
	require.NoError(t, d.MemcpyDtoH(ctx, dst, base+8))
	assert.Equal(t, src, dst)
	// Zero-length copies never reach the driver (this address would fail there).
	assert.NoError(t, d.MemcpyHtoD(ctx, 0x10, nil))
	assert.NoError(t, d.MemcpyDtoH(ctx, []byte{}, 0x10))
	assert.NoError(t, d.MemcpyHtoDAsync(ctx, 0x10, nil, 0))
	assert.NoError(t, d.MemcpyDtoHAsync(ctx, nil, 0x10, 0))

	// Kernel arguments arrive as pointers to aligned copies, in order.
	args := [][]byte{{42, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0xf8, 0x3f}, {'x'}}
	require.NoError(t, d.LaunchKernel(ctx, 0xF00, cuda.Dim3{3, 1, 1}, cuda.Dim3{128, 2, 1}, 64, cuda.StreamPerThread, args))
	args[0][0] = 41 // the fake accepts only 42
	err = d.LaunchKernel(ctx, 0xF00, cuda.Dim3{3, 1, 1}, cuda.Dim3{128, 2, 1}, 64, cuda.StreamPerThread, args)
	assert.ErrorIs(t, err, cuda.ErrInvalidValue)
}

func TestFakeContextSwitching(t *testing.T) {
	d, ctx0 := openFake(t)
	ctx1, err := d.PrimaryCtxRetain(1)
	require.NoError(t, err)
	require.NotEqual(t, ctx0, ctx1)

	// Pin the goroutine so the thread-local "current context" is observable between calls.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	setCalls := func() uint64 {
		v, err := d.CtxGetLimit(ctx0, 6)
		require.NoError(t, err)
		return v
	}
	before := setCalls()
	for range 10 {
		_, err := d.MemAllocAsync(ctx0, 4096, 0)
		require.NoError(t, err)
	}
	assert.Equal(t, before, setCalls(), "an already-current context must not be set again")

	cur, err := d.CtxGetLimit(ctx1, 0)
	require.NoError(t, err)
	assert.Equal(t, uint64(ctx1), cur, "ctx1 is current while a call on it runs")
	cur, err = d.CtxGetLimit(ctx0, 0)
	require.NoError(t, err)
	assert.Equal(t, uint64(ctx0), cur)
	assert.Equal(t, before+2, setCalls(), "each switch costs one cuCtxSetCurrent")

	// Goroutines on other threads see their own context current during their calls.
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := []cuda.Context{ctx0, ctx1}[i%2]
			for range 100 {
				p, err := d.MemAllocAsync(ctx, 4096, cuda.StreamPerThread)
				if !assert.NoError(t, err) {
					return
				}
				assert.Equal(t, cuda.DevicePtr(uint64(ctx)<<16|2), p)
				assert.NoError(t, d.MemFreeAsync(ctx, p, cuda.StreamPerThread))
			}
		}()
	}
	wg.Wait()
}

func TestHotPathDoesNotAllocate(t *testing.T) {
	d, ctx := openFake(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	allocs := testing.AllocsPerRun(1000, func() {
		p, err := d.MemAllocAsync(ctx, 4096, cuda.StreamPerThread)
		if err != nil {
			panic(err)
		}
		if err := d.MemFreeAsync(ctx, p, cuda.StreamPerThread); err != nil {
			panic(err)
		}
		if _, err := d.MemAllocFromPoolAsync(ctx, 4096, 0xB00, cuda.StreamPerThread); err != nil {
			panic(err)
		}
	})
	assert.Zero(t, allocs)
}

func TestMissingRequiredSymbol(t *testing.T) {
	omit := map[string]bool{"cuMemFreeAsync": true}
	for k := range defaultOmit {
		omit[k] = true
	}
	_, err := Open(buildFake(t, omit))
	require.Error(t, err)
	assert.ErrorIs(t, err, cuda.ErrDriverNotFound)
	e := asError(t, err)
	assert.Equal(t, "dlsym", e.Op)
	assert.Contains(t, e.Msg, "cuMemFreeAsync")
	assert.NotContains(t, e.Msg, "other required", "only one symbol is missing")
}

func TestMissingOptionalSymbolWithFallbackMissingToo(t *testing.T) {
	// Without either elapsed-time name the driver is unusable: the binding is required.
	omit := map[string]bool{"cuEventElapsedTime_v2": true, "cuEventElapsedTime": true}
	_, err := Open(buildFake(t, omit))
	require.Error(t, err)
	assert.ErrorIs(t, err, cuda.ErrDriverNotFound)
	assert.Contains(t, err.Error(), "cuEventElapsedTime_v2")
}

func BenchmarkFakeAllocFree(b *testing.B) {
	d, err := Open(os.Getenv("CUDACORE_FAKE_LIBCUDA"))
	if err != nil {
		b.Skip("set CUDACORE_FAKE_LIBCUDA to a built fake driver, or use BenchmarkRealAllocFree")
	}
	benchAllocFree(b, d)
}

func benchAllocFree(b *testing.B, d *Driver) {
	if err := d.Init(); err != nil {
		b.Skip(err)
	}
	ctx, err := d.PrimaryCtxRetain(0)
	if err != nil {
		b.Skip(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		p, err := d.MemAllocAsync(ctx, 4096, cuda.StreamPerThread)
		if err != nil {
			b.Fatal(err)
		}
		if err := d.MemFreeAsync(ctx, p, cuda.StreamPerThread); err != nil {
			b.Fatal(err)
		}
	}
}

// The multi-device and IPC entry points through the C shim: the context each runs in, the 64-byte handles
// in and out (by pointer and by value), the file descriptor as the handle's value, the access descriptor.
func TestFakeMultiDriver(t *testing.T) {
	d, ctx0 := openFake(t)
	ctx1, err := d.PrimaryCtxRetain(1)
	require.NoError(t, err)

	can, err := d.DeviceCanAccessPeer(0, 1)
	require.NoError(t, err)
	assert.True(t, can)
	can, err = d.DeviceCanAccessPeer(1, 1)
	require.NoError(t, err)
	assert.False(t, can)
	_, err = d.DeviceCanAccessPeer(0, 5)
	assert.Equal(t, cuda.ErrorInvalidDevice, cuda.ResultOf(err))
	for _, c := range []struct {
		attr     cuda.P2PAttribute
		src, dst cuda.Device
		want     int
		result   cuda.Result
	}{
		{cuda.P2PPerformanceRank, 0, 1, 10, cuda.Success},
		{cuda.P2PNativeAtomicSupport, 1, 0, 31, cuda.Success},
		{cuda.P2PAccessSupported, 1, 1, 0, cuda.ErrorInvalidDevice},
		{cuda.P2PAccessSupported, 0, 5, 0, cuda.ErrorInvalidDevice},
	} {
		v, err := d.DeviceGetP2PAttribute(c.attr, c.src, c.dst)
		assert.Equal(t, c.result, cuda.ResultOf(err), "%+v", c)
		assert.Equal(t, c.want, v, "%+v", c)
	}
	const buf = cuda.DevicePtr(0x100000)
	legacy, err := d.PointerGetAttribute(ctx0, cuda.PointerLegacyIpcCapable, buf+8)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), legacy, "an int attribute reads back as its value")
	types, err := d.PointerGetAttribute(ctx0, cuda.PointerAllowedHandleTypes, buf)
	require.NoError(t, err)
	assert.Equal(t, uint64(0x100000001), types, "an unsigned long long attribute, whole")
	_, err = d.PointerGetAttribute(ctx0, cuda.PointerLegacyIpcCapable, 8)
	assert.Equal(t, cuda.ErrorInvalidValue, cuda.ResultOf(err))
	mh, err := d.MemRetainAllocationHandle(ctx0, buf)
	require.NoError(t, err)
	assert.Equal(t, cuda.MemHandle(0xABC), mh)
	require.NoError(t, d.MemRelease(ctx0, mh))
	_, err = d.MemRetainAllocationHandle(ctx0, buf+1)
	assert.Equal(t, cuda.ErrorInvalidValue, cuda.ResultOf(err))
	require.NoError(t, d.CtxEnablePeerAccess(ctx0, ctx1), "made in ctx0, for ctx1")
	err = d.CtxEnablePeerAccess(ctx1, ctx0)
	assert.Equal(t, cuda.ErrorPeerAccessAlreadyEnabled, cuda.ResultOf(err))

	const base = cuda.DevicePtr(0x100000)
	require.NoError(t, d.MemcpyHtoD(ctx0, base, []byte("peer bytes")))
	require.NoError(t, d.MemcpyPeerAsync(ctx1, base+100, ctx1, base, ctx0, 10, 0x55))
	got := make([]byte, 10)
	require.NoError(t, d.MemcpyDtoH(ctx0, got, base+100))
	assert.Equal(t, "peer bytes", string(got))

	require.NoError(t, d.MemPoolSetAccess(ctx0, 0xB00, 1, cuda.AccessReadWrite))
	assert.Error(t, d.MemPoolSetAccess(ctx0, 0xB00, 1, cuda.AccessRead))
	acc, err := d.MemPoolGetAccess(ctx0, 0xB00, 1)
	require.NoError(t, err)
	assert.Equal(t, cuda.AccessReadWrite, acc)

	pool, err := d.MemPoolCreate(ctx0, cuda.PoolProps{Device: 1, HandleTypes: cuda.HandlePosixFD})
	require.NoError(t, err)
	assert.Equal(t, cuda.MemPool(0xB01), pool)
	fd, err := d.MemPoolExportToShareableHandle(ctx0, pool, cuda.HandlePosixFD)
	require.NoError(t, err)
	assert.Equal(t, 42, fd)
	_, err = d.MemPoolExportToShareableHandle(ctx0, pool, cuda.HandleFabric)
	assert.ErrorIs(t, err, cuda.ErrNotSupported)
	imported, err := d.MemPoolImportFromShareableHandle(ctx0, 42, cuda.HandlePosixFD)
	require.NoError(t, err)
	assert.Equal(t, cuda.MemPool(0xB02), imported)
	data, err := d.MemPoolExportPointer(ctx0, 0x10)
	require.NoError(t, err)
	assert.Equal(t, byte(0x10+63), data[63])
	var want cuda.IpcHandle
	for i := range want {
		want[i] = byte(i * 3)
	}
	p, err := d.MemPoolImportPointer(ctx0, imported, want)
	require.NoError(t, err)
	assert.Equal(t, cuda.DevicePtr(0x1234), p)

	h, err := d.IpcGetMemHandle(ctx0, 0x7)
	require.NoError(t, err)
	assert.Equal(t, byte(5^7), h[5])
	for i := range want {
		want[i] = byte(i * 5)
	}
	p, err = d.IpcOpenMemHandle(ctx0, want)
	require.NoError(t, err, "the handle arrives by value, with the lazy peer access flag")
	assert.Equal(t, cuda.DevicePtr(0x5678), p)
	require.NoError(t, d.IpcCloseMemHandle(ctx0, p))
	assert.Error(t, d.IpcCloseMemHandle(ctx0, 0x1))

	eh, err := d.IpcGetEventHandle(ctx0, 0x20)
	require.NoError(t, err)
	assert.Equal(t, byte(0x20+9), eh[9])
	for i := range want {
		want[i] = byte(100 - i)
	}
	e, err := d.IpcOpenEventHandle(ctx0, want)
	require.NoError(t, err)
	assert.Equal(t, cuda.Event(0xE0), e)
}
