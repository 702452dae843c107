// Package fast holds the C entry points that the hand-written METH_FASTCALL module (bindings/fastpath.c)
// calls on cudacore's hot paths. They are exported with cgo from this package so that they live in the
// same c-shared library as the gopy-generated code: one extension module, one Go runtime.
package fast

/*
#include <stdint.h>
*/
import "C"

// cudacore_fast_noop returns x: the floor cost of entering Go from the fast path.
//
//export cudacore_fast_noop
func cudacore_fast_noop(x C.int64_t) C.int64_t { return x }
