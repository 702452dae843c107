/*
 * Prototypes of the cgo exports in cudacore/internal/fast, declared by hand: cgo writes an export header
 * only for the main package, and these live in a library package linked into the same shared object.
 * Keep each prototype in step with its //export in fast.go (C.int64_t there is int64_t here).
 */
#ifndef CUDACORE_FASTPATH_H
#define CUDACORE_FASTPATH_H

#include <stdint.h>

extern int64_t cudacore_fast_noop(int64_t x);

#endif
