/*
 * The C guard of cudacore's one door into Go.
 *
 * Every C function that enters Go passes through here: the METH_FASTCALL wrappers that bindings/door
 * generates from the facade's declarations (door_gen.c), the hand-written glue of the _fast module
 * (fast.h lists its files: Buffer, PinnedBuffer, DLPack, copies, launches), the cold door fast.call around gopy's
 * functions, and the PyTorch allocator entry points (torch_shim.cc). The guard's order is fixed:
 *
 *   1. the fork check, before Go is entered: neither the Go runtime nor CUDA survives fork(), so a
 *      child raises IllegalStateError (naming the spawn start method) and never calls Go;
 *   2. argument conversion that names the function and the argument on every failure;
 *   3. the GIL policy of the declaration (hold, or release around the Go call);
 *   4. the one error funnel: Go's wire-format error text becomes its typed exception in exactly one
 *      Python function, cudacore._errors.from_wire, whatever the door.
 *
 * Panic recovery and error encoding are the Go half of the guard (the facade's guard function).
 */
#ifndef CUDACORE_DOOR_H
#define CUDACORE_DOOR_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* Set in a forked child (pthread_atfork), read before every entry into Go. */
extern volatile int cudacore_forked;
/* What the parent's CUDA driver was at the last fork (see door.c): one of the values below. */
extern volatile int cudacore_fork_driver;
#define CUDACORE_FORK_DRIVER_ABSENT 0      /* libcuda was not loaded */
#define CUDACORE_FORK_DRIVER_LOADED 1      /* loaded, cuInit not yet called */
#define CUDACORE_FORK_DRIVER_INITIALIZED 2 /* initialised (by cudacore or another library) */

/* Register the fork handler; called once by the module's init. */
int door_init(void);

/* Register the funnel (the cudacore._errors module, or any object with the same functions). */
int door_configure(PyObject *funnel);

/* The fork check and the argument count of a METH_FASTCALL entry. 0, or -1 with an exception set. */
int door_enter(const char *fn, Py_ssize_t nargs, Py_ssize_t want);

/* The fork check alone: 0, or -1 with IllegalStateError set. */
int door_check_fork(const char *fn);

/* Raise the typed exception for a wire-format error text from Go, and free the text. Returns NULL. */
PyObject *door_raise(char *wire);

/* With a RuntimeError from gopy's generated code set, replace it by the funnel's typed exception, with
 * the original as __cause__. Returns NULL. */
PyObject *door_translate(void);

/* Raise the funnel's error for using a closed object (one code everywhere). Returns NULL. */
PyObject *door_closed(const char *what, const char *op);

/* Raise the funnel's InvalidValueError for a bad argument. Returns -1. */
int door_invalid(const char *fn, const char *arg, const char *detail, PyObject *value);

/* Argument conversions: 0, or -1 with an exception that names fn and arg. */
int door_int(PyObject *o, const char *fn, const char *arg, int64_t *out);
int door_bool(PyObject *o, const char *fn, const char *arg, int *out);
int door_float(PyObject *o, const char *fn, const char *arg, double *out);
int door_str(PyObject *o, const char *fn, const char *arg, const char **out);
/* A C-contiguous buffer view of o, writable if asked; the caller releases it. Arrays of Python objects
 * are refused. */
int door_buffer(PyObject *o, const char *fn, const char *arg, int writable, Py_buffer *view);

/* Whether the device's allocator can block (the synchronous strategy): entries declared
 * "//cudacore:gil device" release the GIL for such devices only. Go publishes it in the snapshot
 * (snapshot.h) when the device opens and when its strategy changes. */
int door_blocking(int64_t ordinal);

/* A str from a malloc'd C string, which is freed. */
PyObject *door_take_str(char *s);

/* The generated METH_FASTCALL wrappers (door_gen.c), NULL-terminated. */
extern PyMethodDef cudacore_door_methods[];

/* The cold door's generated fast wrappers of gopy's exports (cold_gen.c), NULL-terminated. */
extern PyMethodDef cudacore_cold_methods[];

#endif
