/*
 * Prototypes of the cgo exports in cudacore/internal/fast, declared by hand: cgo writes an export header
 * only for the main package, and these live in a library package linked into the same shared object.
 * Keep each prototype in step with its //export in fast.go (C.int64_t there is int64_t here).
 *
 * Every function but noop returns NULL on success, or a malloc'd wire-format error text that the caller
 * frees.
 */
#ifndef CUDACORE_FASTPATH_H
#define CUDACORE_FASTPATH_H

#include <stdint.h>

extern int64_t cudacore_fast_noop(int64_t x);
extern char *cudacore_fast_alloc(int64_t ordinal, int64_t size, uint64_t stream, uint64_t *out);
extern char *cudacore_fast_free(int64_t ordinal, uint64_t ptr, uint64_t size, uint64_t stream);
extern char *cudacore_fast_pinned_alloc(int64_t ordinal, int64_t size, uint64_t *out);
extern char *cudacore_fast_pinned_free(int64_t ordinal, uint64_t addr);
extern char *cudacore_fast_graph_launch(int64_t id, int64_t ordinal, int64_t stream);

/* cudacore/internal/interop (the DLPack export's stream order) */
extern char *cudacore_interop_stream_sync(int64_t ordinal, uint64_t stream);

#endif
