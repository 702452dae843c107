// Package interop holds the C entry points that other frameworks load from cudacore's own extension
// module: PyTorch's CUDAPluggableAllocator (cudacore_torch_malloc / cudacore_torch_free), plus the small
// helpers the DLPack export in bindings/fastpath.c needs. They are cgo exports of this package, linked into
// the same c-shared library as the gopy bindings (docs/design.md, "One Go runtime per process"): torch dlopens
// the very file Python loaded cudacore from, gets the same handle, and so the same Go runtime.
//
// None of them touches Python. The allocator functions never return an error to their caller (PyTorch's
// signature has no room for one): a failure returns 0 (NULL) and records the wire-format error text, which
// cudacore_interop_last_error hands to Python (cudacore.interop.last_error()).
package interop

/*
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
*/
import "C"

import (
	"fmt"
	"runtime/debug"
	"sync"

	"github.com/cudacore/cudacore/cudacore/internal/process"
	"github.com/cudacore/cudacore/pkg/cuda"
)

var (
	errMu   sync.Mutex
	lastErr string

	// live records what cudacore_torch_malloc handed out, so that a free uses the size and stream of the
	// allocation whatever the caller passes, and a pointer cudacore did not allocate is refused rather
	// than handed to the allocator.
	liveMu sync.Mutex
	live   = map[uintptr]torchAlloc{}
)

type torchAlloc struct {
	ordinal int
	size    uint64
	stream  cuda.Stream
}

func record(err error) {
	errMu.Lock()
	lastErr = cuda.Encode(err)
	errMu.Unlock()
}

func recovered(op string, p any) error {
	return &cuda.Error{Op: op, Result: cuda.ErrorInternal, Msg: fmt.Sprintf("panic: %v\n%s", p, debug.Stack())}
}

// cudacore_torch_malloc allocates size bytes on device for use on stream through cudacore's allocator
// for that device (its pool, cache, limit and statistics). It returns the device pointer, or 0 on
// failure (then cudacore_interop_last_error says why). A size of 0 returns 0 without an error.
//
// The C prototype PyTorch calls is void *(ssize_t, int, cudaStream_t); uintptr_t is passed and returned
// the same way on every ABI cudacore builds for.
//
//export cudacore_torch_malloc
func cudacore_torch_malloc(size C.ssize_t, device C.int, stream C.uintptr_t) (out C.uintptr_t) {
	defer func() {
		if p := recover(); p != nil {
			record(recovered("cudacore.torch_malloc", p))
			out = 0
		}
	}()
	if size <= 0 {
		if size < 0 {
			record(cuda.NewError("cudacore.torch_malloc", cuda.ErrorInvalidValue, fmt.Sprintf("size must be >= 0, got %d", int64(size))))
		}
		return 0
	}
	d, err := process.Lookup(int(device))
	if err != nil {
		record(err)
		return 0
	}
	st := cuda.Stream(stream)
	p, err := d.Allocate(uint64(size), st)
	if err != nil {
		record(err)
		return 0
	}
	liveMu.Lock()
	live[uintptr(p)] = torchAlloc{int(device), uint64(size), st}
	liveMu.Unlock()
	return C.uintptr_t(p)
}

// cudacore_torch_free frees what cudacore_torch_malloc returned, in stream order on the stream it was
// allocated on. A null pointer is ignored; a pointer cudacore_torch_malloc did not return is recorded as
// an error and left alone.
//
//export cudacore_torch_free
func cudacore_torch_free(ptr C.uintptr_t, size C.ssize_t, device C.int, stream C.uintptr_t) {
	defer func() {
		if p := recover(); p != nil {
			record(recovered("cudacore.torch_free", p))
		}
	}()
	_, _, _ = size, device, stream // the allocation's own record is used
	if ptr == 0 {
		return
	}
	liveMu.Lock()
	a, ok := live[uintptr(ptr)]
	delete(live, uintptr(ptr))
	liveMu.Unlock()
	if !ok {
		record(cuda.NewError("cudacore.torch_free", cuda.ErrorInvalidValue,
			fmt.Sprintf("%#x was not allocated by cudacore_torch_malloc (or was freed already); not freed", uintptr(ptr))))
		return
	}
	d, err := process.Lookup(a.ordinal)
	if err != nil {
		record(err)
		return
	}
	if err := d.Free(cuda.DevicePtr(ptr), a.size, a.stream); err != nil {
		record(err)
	}
}

// cudacore_torch_live returns how many allocations made by cudacore_torch_malloc are alive.
//
//export cudacore_torch_live
func cudacore_torch_live() C.int64_t {
	liveMu.Lock()
	defer liveMu.Unlock()
	return C.int64_t(len(live))
}

// cudacore_interop_last_error returns the last error an allocator entry point recorded, as a malloc'd
// wire-format C string the caller frees, and forgets it; NULL when there is none.
//
//export cudacore_interop_last_error
func cudacore_interop_last_error() *C.char {
	errMu.Lock()
	defer errMu.Unlock()
	if lastErr == "" {
		return nil
	}
	s := C.CString(lastErr)
	lastErr = ""
	return s
}

// cudacore_interop_peek_error is cudacore_interop_last_error without forgetting the error: the PyTorch
// shim (bindings/torch_shim.cc) reads it for its exception's text and leaves it for last_error().
//
//export cudacore_interop_peek_error
func cudacore_interop_peek_error() *C.char {
	errMu.Lock()
	defer errMu.Unlock()
	if lastErr == "" {
		return nil
	}
	return C.CString(lastErr)
}

// cudacore_interop_stream_sync waits for the work queued on stream (0 or 1: the legacy default stream) of
// device ordinal. The DLPack export calls it when the consumer's stream differs from the buffer's, so that
// the consumer never reads memory the producer's stream has not finished writing. It returns NULL, or a
// malloc'd wire-format error text.
//
//export cudacore_interop_stream_sync
func cudacore_interop_stream_sync(ordinal C.int64_t, stream C.uint64_t) (msg *C.char) {
	defer func() {
		if p := recover(); p != nil {
			msg = C.CString(cuda.Encode(recovered("cudacore.dlpack_sync", p)))
		}
	}()
	d, err := process.Lookup(int(ordinal))
	if err != nil {
		return C.CString(cuda.Encode(err))
	}
	st := cuda.Stream(stream)
	if st == 0 {
		st = cuda.StreamLegacy
	}
	if err := d.Driver().StreamSynchronize(d.Context(), st); err != nil {
		return C.CString(cuda.Encode(err))
	}
	return nil
}
