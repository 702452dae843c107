// Package fast holds the C entry points that the hand-written METH_FASTCALL module (bindings/fastpath.c)
// calls on cudacore's hot paths. They are exported with cgo from this package so that they live in the
// same c-shared library as the gopy-generated code: one extension module, one Go runtime.
//
// Conventions: every entry point returns NULL on success, or the error in the wire format (pkg/cuda
// wire.go) as a C string that the caller owns and must free(). A panic never crosses: it is recovered
// into a CUDACORE_ERROR_INTERNAL error. None of them touches Python; the C side owns the GIL.
package fast

/*
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"fmt"
	"runtime/debug"

	"github.com/cudacore/cudacore/cudacore/internal/process"
	"github.com/cudacore/cudacore/pkg/cuda"
)

// cudacore_fast_noop returns x: the floor cost of entering Go from the fast path.
//
//export cudacore_fast_noop
func cudacore_fast_noop(x C.int64_t) C.int64_t { return x }

func wire(err error) *C.char { return C.CString(cuda.Encode(err)) }

func recovered(op string, p any) *C.char {
	return wire(&cuda.Error{Op: op, Result: cuda.ErrorInternal, Msg: fmt.Sprintf("panic: %v\n%s", p, debug.Stack())})
}

// cudacore_fast_alloc allocates size bytes on device ordinal for use on stream through the device's
// allocator (a cache hit costs no driver call) and stores the pointer in *out.
//
//export cudacore_fast_alloc
func cudacore_fast_alloc(ordinal, size C.int64_t, stream C.uint64_t, out *C.uint64_t) (msg *C.char) {
	defer func() {
		if p := recover(); p != nil {
			msg = recovered("cudacore.allocate", p)
		}
	}()
	if size <= 0 {
		return wire(cuda.NewError("cudacore.allocate", cuda.ErrorInvalidValue,
			fmt.Sprintf("size must be a positive number of bytes, got %d", int64(size))))
	}
	d, err := process.Lookup(int(ordinal))
	if err != nil {
		return wire(err)
	}
	p, err := d.Allocate(uint64(size), cuda.Stream(stream))
	if err != nil {
		return wire(err)
	}
	*out = C.uint64_t(p)
	return nil
}

// cudacore_fast_free frees what cudacore_fast_alloc returned, in stream order on stream.
//
//export cudacore_fast_free
func cudacore_fast_free(ordinal C.int64_t, ptr, size, stream C.uint64_t) (msg *C.char) {
	defer func() {
		if p := recover(); p != nil {
			msg = recovered("cudacore.free", p)
		}
	}()
	d, err := process.Lookup(int(ordinal))
	if err != nil {
		return wire(err)
	}
	if err := d.Free(cuda.DevicePtr(ptr), uint64(size), cuda.Stream(stream)); err != nil {
		return wire(err)
	}
	return nil
}

// cudacore_fast_pinned_alloc allocates size bytes of pinned host memory for device ordinal.
//
//export cudacore_fast_pinned_alloc
func cudacore_fast_pinned_alloc(ordinal, size C.int64_t, out *C.uint64_t) (msg *C.char) {
	defer func() {
		if p := recover(); p != nil {
			msg = recovered("cudacore.allocate_pinned", p)
		}
	}()
	d, err := process.Lookup(int(ordinal))
	if err != nil {
		return wire(err)
	}
	addr, err := d.AllocPinned(int64(size))
	if err != nil {
		return wire(err)
	}
	*out = C.uint64_t(addr)
	return nil
}

// cudacore_fast_pinned_free frees pinned memory from cudacore_fast_pinned_alloc.
//
//export cudacore_fast_pinned_free
func cudacore_fast_pinned_free(ordinal C.int64_t, addr C.uint64_t) (msg *C.char) {
	defer func() {
		if p := recover(); p != nil {
			msg = recovered("cudacore.free_pinned", p)
		}
	}()
	d, err := process.Lookup(int(ordinal))
	if err != nil {
		return wire(err)
	}
	if err := d.FreePinned(uintptr(addr)); err != nil {
		return wire(err)
	}
	return nil
}

// GraphLauncher launches graph id on the stream with handle h of device ordinal. The facade installs it
// (SetGraphLauncher) because the graph registry lives there and the facade imports this package, not the
// other way round.
type GraphLauncher func(id, ordinal, h int) error

var graphLaunch GraphLauncher

// SetGraphLauncher installs the launcher cudacore_fast_graph_launch calls. It is called once, from the
// facade's init, before any Python code runs.
func SetGraphLauncher(f GraphLauncher) { graphLaunch = f }

// cudacore_fast_graph_launch launches graph id on a stream: Graph.launch without gopy's wrapper, which
// doubled the host cost of a launch (5.0 µs against CuPy's 2.5 µs on the H100).
//
//export cudacore_fast_graph_launch
func cudacore_fast_graph_launch(id, ordinal, stream C.int64_t) (msg *C.char) {
	defer func() {
		if p := recover(); p != nil {
			msg = recovered("cudacore.graph_launch", p)
		}
	}()
	if err := graphLaunch(int(id), int(ordinal), int(stream)); err != nil {
		return wire(err)
	}
	return nil
}
