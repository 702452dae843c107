// Package libcuda is the real CUDA driver behind cuda.Driver: it loads libcuda.so.1 with dlopen at run
// time and calls the driver API through a table of entry points found with dlsym. It is the only package
// in cudacore with dlopen, dlsym or cgo (with internal/shimtest, which compiles the shim against a fake
// table for tests).
//
// Nothing links against CUDA at build time, so the package builds, and programs that import it start, on
// any Linux machine. Without a driver, Open returns an error matching cuda.ErrDriverNotFound that says
// what was tried and what to do; no call ever reaches a missing entry point.
//
// Contexts: every method that takes a cuda.Context makes it current on the calling OS thread and calls the
// entry point inside one C function, so goroutines need not lock their threads and a Python thread that
// calls in for the first time works. A Context of 0 is rejected with CUDA_ERROR_INVALID_CONTEXT rather than
// unbinding the thread's context.
//
// Streams: cuda.Stream values are the driver's own. 0 and cuda.StreamLegacy (0x1) name the legacy default
// stream, cuda.StreamPerThread (0x2) the per-thread default stream; they pass through unchanged.
//
// Cost: each method is one cgo call. BenchmarkRealAllocFree measures a MemAllocAsync + MemFreeAsync pair,
// to compare with the same pair called from C in docs/contributing/driver-facts.md.
package libcuda

// The noescape and nocallback directives below cover every wrapper that calls the driver: none keeps a
// pointer it was given past its return, and no driver entry point cudacore binds calls back into Go. They
// let out-parameters stay on the Go stack, which keeps MemAllocAsync, MemAllocFromPoolAsync and
// MemFreeAsync free of Go allocations (TestHotPathDoesNotAllocate), and let the runtime skip callback
// bookkeeping. A test checks that every cc_ call in shim.h is listed.

/*
#cgo LDFLAGS: -ldl
#cgo noescape cc_ctxGetLimit
#cgo nocallback cc_ctxGetLimit
#cgo noescape cc_ctxGetStreamPriorityRange
#cgo nocallback cc_ctxGetStreamPriorityRange
#cgo noescape cc_ctxSetLimit
#cgo nocallback cc_ctxSetLimit
#cgo noescape cc_ctxSynchronize
#cgo nocallback cc_ctxSynchronize
#cgo noescape cc_deviceGet
#cgo nocallback cc_deviceGet
#cgo noescape cc_deviceGetAttribute
#cgo nocallback cc_deviceGetAttribute
#cgo noescape cc_deviceGetCount
#cgo nocallback cc_deviceGetCount
#cgo noescape cc_deviceGetDefaultMemPool
#cgo nocallback cc_deviceGetDefaultMemPool
#cgo noescape cc_deviceGetMemPool
#cgo nocallback cc_deviceGetMemPool
#cgo noescape cc_deviceSetMemPool
#cgo nocallback cc_deviceSetMemPool
#cgo noescape cc_deviceGetName
#cgo nocallback cc_deviceGetName
#cgo noescape cc_deviceGetPCIBusId
#cgo nocallback cc_deviceGetPCIBusId
#cgo noescape cc_deviceGetUuid
#cgo nocallback cc_deviceGetUuid
#cgo noescape cc_deviceGraphMemTrim
#cgo nocallback cc_deviceGraphMemTrim
#cgo noescape cc_deviceTotalMem
#cgo nocallback cc_deviceTotalMem
#cgo noescape cc_driverGetVersion
#cgo nocallback cc_driverGetVersion
#cgo noescape cc_eventCreate
#cgo nocallback cc_eventCreate
#cgo noescape cc_eventDestroy
#cgo nocallback cc_eventDestroy
#cgo noescape cc_eventElapsedTime
#cgo nocallback cc_eventElapsedTime
#cgo noescape cc_eventQuery
#cgo nocallback cc_eventQuery
#cgo noescape cc_eventRecord
#cgo nocallback cc_eventRecord
#cgo noescape cc_eventSynchronize
#cgo nocallback cc_eventSynchronize
#cgo noescape cc_funcGetAttribute
#cgo nocallback cc_funcGetAttribute
#cgo noescape cc_getErrorName
#cgo nocallback cc_getErrorName
#cgo noescape cc_graphDebugDotPrint
#cgo nocallback cc_graphDebugDotPrint
#cgo noescape cc_graphDestroy
#cgo nocallback cc_graphDestroy
#cgo noescape cc_graphExecDestroy
#cgo nocallback cc_graphExecDestroy
#cgo noescape cc_graphExecUpdate
#cgo nocallback cc_graphExecUpdate
#cgo noescape cc_graphInstantiate
#cgo nocallback cc_graphInstantiate
#cgo noescape cc_graphLaunch
#cgo nocallback cc_graphLaunch
#cgo noescape cc_graphNodeCount
#cgo nocallback cc_graphNodeCount
#cgo noescape cc_graphUpload
#cgo nocallback cc_graphUpload
#cgo noescape cc_init
#cgo nocallback cc_init
#cgo noescape cc_launchKernel
#cgo nocallback cc_launchKernel
#cgo noescape cc_memAdvise
#cgo nocallback cc_memAdvise
#cgo noescape cc_memAlloc
#cgo nocallback cc_memAlloc
#cgo noescape cc_memAllocAsync
#cgo nocallback cc_memAllocAsync
#cgo noescape cc_memAllocFromPoolAsync
#cgo nocallback cc_memAllocFromPoolAsync
#cgo noescape cc_memAllocManaged
#cgo nocallback cc_memAllocManaged
#cgo noescape cc_memFree
#cgo nocallback cc_memFree
#cgo noescape cc_memFreeAsync
#cgo nocallback cc_memFreeAsync
#cgo noescape cc_memFreeHost
#cgo nocallback cc_memFreeHost
#cgo noescape cc_memGetInfo
#cgo nocallback cc_memGetInfo
#cgo noescape cc_memHostAlloc
#cgo nocallback cc_memHostAlloc
#cgo noescape cc_memPoolCreate
#cgo nocallback cc_memPoolCreate
#cgo noescape cc_memPoolDestroy
#cgo nocallback cc_memPoolDestroy
#cgo noescape cc_memPoolGetAttribute
#cgo nocallback cc_memPoolGetAttribute
#cgo noescape cc_memPoolSetAttribute
#cgo nocallback cc_memPoolSetAttribute
#cgo noescape cc_memPoolTrimTo
#cgo nocallback cc_memPoolTrimTo
#cgo noescape cc_memPrefetchAsync
#cgo nocallback cc_memPrefetchAsync
#cgo noescape cc_memcpyDtoD
#cgo nocallback cc_memcpyDtoD
#cgo noescape cc_memcpyDtoDAsync
#cgo nocallback cc_memcpyDtoDAsync
#cgo noescape cc_memcpyDtoH
#cgo nocallback cc_memcpyDtoH
#cgo noescape cc_memcpyDtoHAsync
#cgo nocallback cc_memcpyDtoHAsync
#cgo noescape cc_memcpyHtoD
#cgo nocallback cc_memcpyHtoD
#cgo noescape cc_memcpyHtoDAsync
#cgo nocallback cc_memcpyHtoDAsync
#cgo noescape cc_memsetD8Async
#cgo nocallback cc_memsetD8Async
#cgo noescape cc_moduleGetFunction
#cgo nocallback cc_moduleGetFunction
#cgo noescape cc_moduleLoadData
#cgo nocallback cc_moduleLoadData
#cgo noescape cc_moduleUnload
#cgo nocallback cc_moduleUnload
#cgo noescape cc_primaryCtxRelease
#cgo nocallback cc_primaryCtxRelease
#cgo noescape cc_primaryCtxRetain
#cgo nocallback cc_primaryCtxRetain
#cgo noescape cc_streamBeginCapture
#cgo nocallback cc_streamBeginCapture
#cgo noescape cc_streamCreate
#cgo nocallback cc_streamCreate
#cgo noescape cc_streamDestroy
#cgo nocallback cc_streamDestroy
#cgo noescape cc_streamEndCapture
#cgo nocallback cc_streamEndCapture
#cgo noescape cc_streamIsCapturing
#cgo nocallback cc_streamIsCapturing
#cgo noescape cc_streamQuery
#cgo nocallback cc_streamQuery
#cgo noescape cc_streamSynchronize
#cgo nocallback cc_streamSynchronize
#cgo noescape cc_drainPerThreadAtExit
#cgo nocallback cc_drainPerThreadAtExit
#cgo noescape cc_streamWaitEvent
#cgo nocallback cc_streamWaitEvent
#cgo noescape cc_deviceCanAccessPeer
#cgo nocallback cc_deviceCanAccessPeer
#cgo noescape cc_ctxEnablePeerAccess
#cgo nocallback cc_ctxEnablePeerAccess
#cgo noescape cc_memcpyPeerAsync
#cgo nocallback cc_memcpyPeerAsync
#cgo noescape cc_memPoolSetAccess
#cgo nocallback cc_memPoolSetAccess
#cgo noescape cc_memPoolGetAccess
#cgo nocallback cc_memPoolGetAccess
#cgo noescape cc_memPoolExportToShareableHandle
#cgo nocallback cc_memPoolExportToShareableHandle
#cgo noescape cc_memPoolImportFromShareableHandle
#cgo nocallback cc_memPoolImportFromShareableHandle
#cgo noescape cc_memPoolExportPointer
#cgo nocallback cc_memPoolExportPointer
#cgo noescape cc_memPoolImportPointer
#cgo nocallback cc_memPoolImportPointer
#cgo noescape cc_ipcGetMemHandle
#cgo nocallback cc_ipcGetMemHandle
#cgo noescape cc_ipcOpenMemHandle
#cgo nocallback cc_ipcOpenMemHandle
#cgo noescape cc_ipcCloseMemHandle
#cgo nocallback cc_ipcCloseMemHandle
#cgo noescape cc_ipcGetEventHandle
#cgo nocallback cc_ipcGetEventHandle
#cgo noescape cc_ipcOpenEventHandle
#cgo nocallback cc_ipcOpenEventHandle
#cgo noescape cc_deviceGetP2PAttribute
#cgo nocallback cc_deviceGetP2PAttribute
#cgo noescape cc_pointerGetAttribute
#cgo nocallback cc_pointerGetAttribute
#cgo noescape cc_memRetainAllocationHandle
#cgo nocallback cc_memRetainAllocationHandle
#cgo noescape cc_memRelease
#cgo nocallback cc_memRelease
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"os"
	"reflect"
	"sync"
	"unsafe"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// DefaultPath is the library Open("") loads: the driver's soname, found through the dynamic loader's
// usual search (LD_LIBRARY_PATH, ld.so.cache), as every CUDA program finds it.
const DefaultPath = "libcuda.so.1"

// EnvPath names the environment variable with which a user points cudacore at another driver library.
// Open itself does not read it; PathFromEnv does, for the code that chooses the backend.
const EnvPath = "CUDACORE_LIBCUDA"

// PathFromEnv returns $CUDACORE_LIBCUDA, or DefaultPath when it is unset or empty.
func PathFromEnv() string {
	if p := os.Getenv(EnvPath); p != "" {
		return p
	}
	return DefaultPath
}

// Driver is a loaded CUDA driver library. It implements cuda.Driver and is safe for use from many
// goroutines at once. A Driver is never unloaded: the driver keeps threads and device state for the whole
// process, and dlclose under it is not safe.
type Driver struct {
	path  string
	tab   *C.cc_table     // complete before the Driver is published; C memory, never freed
	bound [numSyms]string // the name bound for each binding, "" where an optional one is absent
}

var _ cuda.Driver = (*Driver)(nil)

// Table returns the address of the driver's table of entry points (C memory, complete before the Driver
// was published and never freed), for C code of this process that calls the shim's cc_* functions itself
// rather than through Go: the direct path of the hot calls (cudacore/native). Nothing may write to it.
func (d *Driver) Table() uintptr { return uintptr(unsafe.Pointer(d.tab)) }

var (
	openMu sync.Mutex
	opened = map[string]*Driver{}
)

// Open loads the CUDA driver library at path ("" means DefaultPath, libcuda.so.1) and binds every entry
// point cudacore uses. Loading happens once per path: later calls with the same path return the same
// *Driver. A failure is not remembered, so a caller may try again after the user installs a driver.
//
// Open does not call cuInit; call Init before anything else.
//
// On failure the error is a *cuda.Error with Result cuda.ErrorDriverNotFound (errors.Is(err,
// cuda.ErrDriverNotFound)): Op "dlopen" when the file could not be loaded, with the loader's reason, or Op
// "dlsym" when it loaded but lacks a required entry point (not a CUDA driver, or one older than CUDA
// 11.2), naming the symbol.
func Open(path string) (*Driver, error) {
	if path == "" {
		path = DefaultPath
	}
	// One lock for all paths: loads are rare, and the lock is what guarantees that no caller ever sees a
	// half-built table (CuPy crashed on exactly that, with threads plus processes).
	openMu.Lock()
	defer openMu.Unlock()
	if d, ok := opened[path]; ok {
		return d, nil
	}
	d, err := load(path)
	if err != nil {
		return nil, err
	}
	opened[path] = d
	return d, nil
}

const remedy = "install the NVIDIA driver (it provides libcuda.so.1), set " + EnvPath +
	" to the path of libcuda.so.1, or set CUDACORE_BACKEND=sim to use the simulator"

func load(path string) (*Driver, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var errbuf [512]C.char
	lib := C.cc_dlopen(cpath, &errbuf[0], C.size_t(len(errbuf)))
	if lib == nil {
		return nil, cuda.NewError("dlopen", cuda.ErrorDriverNotFound,
			fmt.Sprintf("cannot load the CUDA driver library %q (%s); %s",
				path, C.GoString(&errbuf[0]), remedy))
	}

	// Build the whole table privately; it becomes reachable only through the *Driver returned at the end.
	tab := C.cc_table_new()
	if tab == nil {
		C.cc_dlclose(lib)
		return nil, cuda.NewError("Open", cuda.ErrorOutOfMemory, "cannot allocate the entry point table")
	}
	d := &Driver{path: path, tab: tab}
	var missing []string
	for i := range bindings {
		b := &bindings[i]
		for _, name := range b.names {
			cname := C.CString(name)
			fn := C.cc_dlsym(lib, cname)
			C.free(unsafe.Pointer(cname))
			if fn != nil {
				C.cc_table_set(tab, C.size_t(i), fn)
				d.bound[i] = name
				break
			}
		}
		if d.bound[i] == "" && !b.optional {
			missing = append(missing, b.names[0])
		}
	}
	if len(missing) > 0 {
		C.free(unsafe.Pointer(tab))
		C.cc_dlclose(lib)
		more := ""
		if len(missing) > 1 {
			more = fmt.Sprintf(" (nor %d other required entry points)", len(missing)-1)
		}
		return nil, cuda.NewError("dlsym", cuda.ErrorDriverNotFound,
			fmt.Sprintf("%q loaded but does not export %s%s: it is not a CUDA driver, or one older than "+
				"CUDA 11.2; %s", path, missing[0], more, remedy),
			cuda.Field{Key: "symbol", Value: missing[0]})
	}
	return d, nil
}

// Path returns the library path Open was given (DefaultPath for "").
func (d *Driver) Path() string { return d.path }

// Bound returns the symbol bound for the cc_table field named field (such as "cuMemAlloc" ->
// "cuMemAlloc_v2"), or "" when the driver lacks that optional entry point or field is unknown. It is for
// diagnostics (cudacore's info report) and tests.
func (d *Driver) Bound(field string) string {
	for i := range bindings {
		if bindings[i].field == field {
			return d.bound[i]
		}
	}
	return ""
}

// fail turns a failed wrapper result into the *cuda.Error naming the entry point that failed: sym, or the
// cuCtxGetCurrent / cuCtxSetCurrent call that the wrapper made first. It runs only on failure, so it may
// allocate.
func (d *Driver) fail(sym int, r C.CUresult) error {
	code := int32(r)
	op := d.op(sym)
	msg := ""
	switch {
	case code&C.CC_FAIL_NOCONTEXT != 0:
		return cuda.NewError(op, cuda.ErrorInvalidContext,
			"no context given (Context 0): retain the device's primary context and pass it")
	case code&C.CC_FAIL_GETCURRENT != 0:
		msg = "making the context current before " + op
		op = d.op(symCtxGetCurrent)
	case code&C.CC_FAIL_SETCURRENT != 0:
		msg = "making the context current before " + op
		op = d.op(symCtxSetCurrent)
	}
	res := cuda.Result(code &^ C.CC_FAIL_MASK)
	if !res.Known() {
		// A newer driver may return a code this build's table lacks: its own name for it is the best help.
		if name := C.cc_getErrorName(d.tab, C.CUresult(res)); name != nil {
			if msg != "" {
				msg += ": "
			}
			msg += "the driver calls it " + C.GoString(name)
		}
	}
	return cuda.NewError(op, res, msg)
}

// op returns the name bound for sym, or its preferred name where it is absent.
func (d *Driver) op(sym int) string {
	if n := d.bound[sym]; n != "" {
		return n
	}
	return bindings[sym].names[0]
}

// need returns nil when the optional entry point sym is bound, and otherwise the ErrorNotSupported error
// that the methods needing it return.
func (d *Driver) need(sym int) error {
	if d.bound[sym] != "" {
		return nil
	}
	b := &bindings[sym]
	return cuda.NewError(b.names[0], cuda.ErrorNotSupported,
		fmt.Sprintf("the CUDA driver %q does not export %s; it needs a driver for CUDA %s or newer",
			d.path, b.names[0], b.since))
}

// tableFields returns the cc_table field names in order, for the test that checks bindings against shim.h.
func tableFields() (names []string, entries int) {
	rt := reflect.TypeFor[C.cc_table]()
	for i := range rt.NumField() {
		names = append(names, rt.Field(i).Name)
	}
	return names, int(C.cc_table_len())
}

func itoa(n int) string { return fmt.Sprint(n) }
