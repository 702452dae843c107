// Package cudacore is the facade that gopy binds into the Python extension module: coarse calls with
// gopy-friendly signatures (ints, strings, (T, error) returns) over the packages in pkg/.
//
// Rules for every exported function here (gil_test.go checks each):
//
//   - It returns (T, error), never a bare error: gopy leaks a C string per call for error-only returns.
//
//   - Its body runs inside guard, which turns a panic into an error (a panic that reaches gopy's code kills
//     the interpreter) and renders errors in the wire format of pkg/cuda (wire.go), which python/cudacore
//     parses into typed exceptions.
//
//   - Its doc comment ends with a GIL directive, read by the build (bindings/gil):
//
//     //cudacore:gil hold      the call is short and cannot block: keep the GIL (0.42 µs a call instead of
//     0.83 µs, and no convoy when threads call at once)
//     //cudacore:gil release   the call can wait (synchronize, large copies, the synchronous allocator,
//     graph instantiation): let other Python threads run meanwhile
//
// gopy releases the GIL around every call by default; the build removes that for the "hold" functions.
package cudacore
