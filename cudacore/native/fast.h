/*
 * The internal header of cudacore._fast (cudacore/native): what its files share. Each file holds one kind
 * of object or one group of module functions:
 *
 *   fast.c         the module: configure(), the snapshot's queries, fork state, init
 *   buffer.c       Buffer: device memory, its DLPack export and its copies' hot cases
 *   pinned.c       PinnedBuffer: page-locked host memory with the buffer protocol
 *   alloc.c        allocation into new Buffers and PinnedBuffers, the recycle log's C side, wrap and borrow
 *   device.c       Device's C base: the ordinal
 *   stream.c       Stream's C base: its checked fields, and the hot methods synchronize and query
 *   event.c        Event's C base: its handle, and the hot methods synchronize and query
 *   graph.c        Graph's C base: its executable graph, and the hot method launch
 *   module.c       Module's C base: whether it is loaded
 *   kernel.c       Kernel's C base (its function handle and spec, the hot method launch) and KernelArg's
 *   streams.c      stream arguments resolved in C
 *   launch.c       kernel arguments packed in C, kernel and graph launches (direct and through Go)
 *   stacks.c       Python stacks recorded for allocations
 *   call.c         the cold door: gopy's functions called with errors through the funnel
 *
 * The facts these decide on that Go owns are in the snapshot (snapshot.h), never copied here; what the
 * Python layer owns is read in place (streams.c), or is a field of the C bases of its classes. Everything declared here is hidden: it is shared by the
 * files of this module, not exported from the extension library.
 */
#ifndef CUDACORE_FAST_H
#define CUDACORE_FAST_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "direct.h"
#include "door.h"
#include "door_gen.h"
#include "recycle.h"
#include "snapshot.h"
#include "tables_gen.h"

#pragma GCC visibility push(hidden)

/* Whether the direct path may make a call that names device memory: no graph memory allocation is
 * pending (the snapshot's count, which Go publishes). While one is, copies and kernel launches go through
 * Go, whose checks refuse such memory named outside its capture: the direct path cannot tell which
 * addresses it covers. */
static inline int
no_pending_graph_memory(void)
{
    return !cc_snapshot_graph_memory_pending();
}

extern PyTypeObject *buffer_type;   /* the registered subclass of Buffer; NULL until configure() */
extern PyTypeObject *pinned_type;   /* likewise for PinnedBuffer */

extern PyTypeObject PinnedType; /* pinned.c */
extern PyTypeObject BufferType; /* buffer.c */
extern PyTypeObject DeviceType; /* device.c */
extern PyTypeObject StreamType; /* stream.c */
extern PyTypeObject EventType;  /* event.c */
extern PyTypeObject GraphType;  /* graph.c */
extern PyTypeObject ModuleType; /* module.c */
extern PyTypeObject KernelType; /* kernel.c */
extern PyTypeObject KernelArgType; /* kernel.c */

/* The C bases of the Python layer's Device, Stream, Event, Graph, Module, Kernel and KernelArg: the fields
 * the fast path reads, at fixed offsets. The Python classes subclass them (for their other attributes and
 * methods) and set these fields through the members of the same names (_ordinal, _handle, _owned, ...);
 * C reads them on any instance of the type, subclasses included, since a subclass cannot move them. What
 * makes a read good until the driver has the call is the Python layer's contract: whatever destroys the
 * driver object clears the field that vouches for it first, with the GIL held (Stream.close, Event.close,
 * Graph.destroy, Module.unload). Instances start zeroed: object.__new__(cls) stays the constructor. */
typedef struct {
    PyObject_HEAD
    int64_t ordinal;
    PyObject *weakreflist;
} DeviceObject;

typedef struct {
    PyObject_HEAD
    PyObject *device; /* the Device; NULL until set */
    int64_t handle;
    char owned;  /* this object created the driver stream and its close() destroys it */
    char closed; /* close() destroyed it */
    PyObject *weakreflist;
} StreamObject;

typedef struct {
    PyObject_HEAD
    PyObject *device;
    int64_t handle; /* 0 once closed */
    PyObject *weakreflist;
} EventObject;

typedef struct {
    PyObject_HEAD
    PyObject *device;
    int64_t exec; /* the executable graph Go handed out at a launch; 0: launch through Go */
    PyObject *weakreflist;
} GraphObject;

typedef struct {
    PyObject_HEAD
    PyObject *device;
    char loaded;
    PyObject *weakreflist;
} ModuleObject;

typedef struct {
    PyObject_HEAD
    int64_t direct;   /* the driver's function handle Go handed out at a launch; 0: launch through Go */
    PyObject *module; /* the Module */
    PyObject *spec;   /* bytes: the launch spec (launch.c), or None when the parameters are not known */
} KernelObject;

typedef struct {
    PyObject_HEAD
    int64_t code;  /* the kind's argument code (CC_ARG_*) */
    PyObject *raw; /* bytes: the value as the kernel receives it */
} KernelArgObject;

/* The ordinal of device (a Device, or NULL), or -1. */
static inline int64_t
ordinal_of(PyObject *device)
{
    return device != NULL && PyObject_TypeCheck(device, &DeviceType) ? ((DeviceObject *)device)->ordinal : -1;
}

/* PinnedBuffer's object (pinned.c). */
typedef struct {
    PyObject_HEAD
    uint64_t ptr;
    uint64_t size;
    int64_t device;
    char closed; /* a char: exposed read-only as a bool through PyMemberDef (T_BOOL) */
    char freeing; /* a free is in flight with the GIL released */
    Py_ssize_t exports; /* live memoryviews: while any exist, close() must refuse */
    PyObject *weakreflist;
} PinnedObject;

/* Buffer's object (buffer.c). */
typedef struct {
    PyObject_HEAD
    uint64_t ptr;
    uint64_t size;
    uint64_t stream;
    int64_t device;
    char closed; /* a char: exposed read-only as a bool through PyMemberDef (T_BOOL) */
    char freeing; /* a free is in flight with the GIL released: another close() must not free again */
    PyObject *weakreflist;
    /* A borrowed Buffer (cudacore.interop.ExternalBuffer) views memory another library owns: close() drops
     * the reference to owner and frees nothing. */
    int borrowed;
    PyObject *owner;
    /* DLPack capsules handed out and not yet deleted by their consumer: while any exist, close() refuses
     * (the consumer is still using the memory). Each holds a reference to this object. */
    Py_ssize_t dlpack_exports;
    /* Allocated by Device.allocate on the legacy stream: its free may go to the recycle log (recycle_ok). */
    char recyclable;
    /* Allocated during a capture: Go's owner token for it (from the Allocate door; 0 otherwise), which its free
     * passes back (the GraphFree door), so that a free after its memory went void, when the driver may have
     * handed the address to another owner, frees nothing. Set by the Python layer when it notes the buffer. */
    int64_t graph_token;
    /* The stream object of another library the buffer was allocated on (a CuPy stream, say), held until the
     * buffer is freed: such a stream is destroyed when its object goes, and the free must find it alive. */
    PyObject *keep;
    /* Views (buf[a:b]): a view is a borrowed Buffer whose owner is its parent Buffer. The owner reference
     * keeps the parent object alive, and the parent's views count keeps its memory: its close() refuses
     * while any view of it is open, as while a DLPack export lives. A view gives its count back when it is
     * closed or deallocated. */
    Py_ssize_t views; /* open views of this buffer */
    char is_view;     /* this buffer is a view: owner is the parent Buffer whose views count it holds */
    char ordered;     /* a view of cudacore's own memory (not of a borrowed buffer's): its DLPack export is
                       * ordered on the parent's stream, which it carries, as the parent's is */
    /* Calls under way that use the memory with the GIL released (a copy, a fill: buffer_use): close()
     * waits until there are none, so that no such call goes on into memory freed meanwhile, which the
     * allocator may have handed to another Buffer. */
    Py_ssize_t uses;
} BufferObject;

/* Whether b's memory is gone for a call that would name it: b closed or being freed, or b a view of a
 * buffer that is, at any depth (graph memory voided when its capture ended without a graph takes the
 * memory of its views, and of their views, with it). */
static inline int
buffer_gone(const BufferObject *b)
{
    for (;;) {
        if (b->closed || b->freeing) {
            return 1;
        }
        if (!b->is_view || b->owner == NULL) {
            return 0;
        }
        b = (const BufferObject *)b->owner;
    }
}

/* The stream arguments of the Python layer's hot methods, resolved here rather than in Python frames. Set
 * by configure_streams(); until then every stream object takes the Python path. */
extern PyObject *handles_dict;     /* cudacore._handles' module dict: its open_stream_blocks count */
extern PyObject *stream_resolver;  /* cudacore._handles.stream_handle(stream, device) -> int */
extern PyObject *capture_noter;    /* cudacore._stream.note_capture_buffers(buffers) */
extern PyObject *str_open_blocks;

/* An exact int's value, or -1 (never an exception: the values read here are handles and ordinals). */
static inline int64_t
int_of(PyObject *v)
{
    if (v == NULL || !PyLong_CheckExact(v)) {
        return -1;
    }
    int overflow = 0;
    long long r = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow != 0 || (r == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    return r;
}

/* buffer.c */
void wait_for_free(volatile char *freeing);
int buffer_free(BufferObject *self, int dealloc);
void dealloc_owner(PyObject *self, int (*free_fn)(PyObject *), PyObject *weakreflist);
PyObject *buffer_enter(PyObject *self, PyObject *ignored);

/* alloc.c */
int recycle_ok(void);
int note_if_capturing(PyObject *buf);

/* fast.c: the hot methods of the C bases (stream.c, event.c, graph.c, kernel.c) take the direct path when
 * they may and otherwise call the general path, the Python subclass's method of the name given (_launch,
 * _synchronize, ...), whose signature is the hot method's own, with the caller's arguments as they came:
 * its checks and errors are the method's. */
PyObject *call_general(PyObject *self, PyObject *name, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
int hot_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const char *const *names, int n, PyObject **out);
/* VAR: the interned name TEXT, made at the first call (a failure returns NULL, the exception set). */
#define GENERAL_NAME(VAR, TEXT)                                                                                \
    static PyObject *VAR;                                                                                      \
    if (VAR == NULL && (VAR = PyUnicode_InternFromString(TEXT)) == NULL) {                                     \
        return NULL;                                                                                           \
    }

/* stream.c: query until the work is done, for at most 20 µs: 1 done, 0 still running, -1 not taken. */
int direct_spin(int (*query)(int64_t, uint64_t), int64_t device, uint64_t handle);

/* streams.c */
uint64_t direct_stream(PyObject *stream, int64_t device);
int64_t stream_handle_on(PyObject *stream, int64_t device);
int no_stream_blocks(void);
int resolve_stream(PyObject *stream, int64_t device, const char *fn, int64_t *out, int *owned);
PyObject *current_stream_object(int64_t device);
PyObject *current_for_direct(int64_t device);

/* launch.c */
int graph_direct(PyObject *graph, PyObject *stream);
int kernel_direct(PyObject *kernel, const int64_t v[7], PyObject *stream, PyObject *args);

/* stacks.c */
extern int stack_frames;
void label_allocation(int64_t device, int64_t ptr);

/* Each file's module functions, added to the module at init (fast.c). */
extern PyMethodDef cc_alloc_functions[];
extern PyMethodDef cc_buffer_functions[]; /* buffer.c: using() */
extern PyTypeObject UseType;              /* buffer.c: what using() returns */
extern PyMethodDef cc_call_functions[];
extern PyMethodDef cc_launch_functions[];
extern PyMethodDef cc_stacks_functions[];
extern PyMethodDef cc_streams_functions[];

#pragma GCC visibility pop

#endif
