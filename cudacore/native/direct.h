/*
 * The direct path of the hot calls: a graph launch, a kernel launch or a small copy made from C, without entering
 * Go, once cudacore has checked what it needs (cudacore/direct.go says when that holds).
 *
 * Every function here is called with the GIL held, after the caller (the files of cudacore/native, or the Python
 * layer through _fast) has established that the call would pass every check of cudacore's: the stream is one the caller's
 * object owns and has not closed, no stream of cudacore captures (the snapshot's count), and the memory or
 * executable graph is alive. The GIL is what makes that hold until the driver has the call: every close and destroy of those
 * objects marks them, with the GIL held, before it reaches Go, and nothing here releases the GIL.
 */
#ifndef CUDACORE_DIRECT_H
#define CUDACORE_DIRECT_H

#include <stddef.h>
#include <stdint.h>

/* How a device is reached, and the largest pageable copy C hands to the driver, are the device's facts
 * in the snapshot (snapshot.h), which Go publishes when it opens the device. */

/* Whether the device's calls may take the direct path at all. */
int direct_enabled(int64_t device);

/* Whether a pageable host-to-device copy of n bytes goes to the driver's own pageable copy on this
 * device, as cudacore's stream manager would send it (larger ones are staged, in Go). */
int direct_pageable(int64_t device, size_t n);

/* Make the call. 1 when the driver took it; 0 when it did not (not configured, or the driver failed: the
 * caller takes the full path through Go, which makes the call again and reports the error). No Python
 * exception is ever set. */
int direct_graph_launch(int64_t device, uint64_t exec, uint64_t stream);
int direct_copy_to_device(int64_t device, uint64_t dst, const void *src, size_t n, uint64_t stream);
int direct_copy_to_host(int64_t device, void *dst, uint64_t src, size_t n, uint64_t stream);
/* params: one pointer per kernel parameter, to its value. The simulator runs no device code: there it
 * is never taken. */
int direct_launch(int64_t device, uint64_t fn, const unsigned int grid[3], const unsigned int block[3],
                  unsigned int shared, uint64_t stream, void **params);

/* Query a stream's or an event's work: 1 finished, 0 not yet, -1 not taken (not configured, or the driver
 * failed: the caller takes the full path through Go, which queries again and reports the error). No Python
 * exception is ever set. */
int direct_stream_query(int64_t device, uint64_t stream);
int direct_event_query(int64_t device, uint64_t event);

#endif
