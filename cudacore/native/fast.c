/*
 * _fast: the C module of cudacore's hot paths, compiled into the one extension library.
 *
 * It holds what a generator cannot express: the objects users hold (Buffer and PinnedBuffer, C types
 * with no per-instance dict, so that an allocate+close pair costs about what CuPy's pool does), their
 * DLPack export, and the cold door `call` around gopy's functions. The generated METH_FASTCALL wrappers
 * of the facade's hot entries (door_gen.c, from bindings/door) are added to this module at init. Every
 * function here that enters Go passes the guard of door.h first (the fork check), and every error from
 * Go goes through the one funnel (door_raise).
 *
 * Python loads this module from the gopy extension's own file under the name cudacore._fast: CPython
 * dlopens the same path again, gets the same handle (one Go runtime per process), and calls PyInit__fast.
 *
 * Ownership: a Buffer owns its device allocation and a PinnedBuffer its host allocation from creation
 * until a close() or deallocation whose free succeeds; close() is idempotent, so there is never a double
 * free, and a free that fails leaves the object open, so that close() can be retried. The Python layer
 * (python/cudacore/_memory.py) subclasses both types to add methods and registers the subclasses and the
 * error funnel with configure().
 */
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

/* The count of graph memory allocations that no launch has made real (cudacore/internal/process/graphmem.go).
 * While it is not zero, copies and kernel launches go through Go, whose checks refuse such memory named
 * outside its capture: the direct path cannot tell which addresses it covers. */
extern volatile int cudacore_graph_memory_pending;

/* Whether the direct path may make a call that names device memory: no graph memory is pending. */
static inline int
no_pending_graph_memory(void)
{
    return __atomic_load_n(&cudacore_graph_memory_pending, __ATOMIC_SEQ_CST) == 0;
}

static PyTypeObject *buffer_type;   /* the registered subclass of Buffer; NULL until configure() */
static PyTypeObject *pinned_type;   /* likewise for PinnedBuffer */
static PyTypeObject *stream_type;   /* cudacore.Stream, for the copies' hot case; NULL until configure() */

/* Asynchronous copies up to this size keep the GIL (they only enqueue work): python/cudacore/_copy.py's
 * HELD_MAX, passed by configure(). */
static Py_ssize_t held_max;

/* PinnedBuffer's object, declared here because Buffer's copies take one (its type is below). */
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
static PyTypeObject PinnedType;
static PyTypeObject BufferType; /* defined below, with its methods */
static int recycle_ok(void);    /* defined with allocate_buffer */

/* ---------------------------------------------------------------------------------------------------- */
/* Buffer: device memory                                                                                */

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
} BufferObject;

/* Wait, with the GIL released in between, until another thread's free of this object has returned (it
 * released the GIL for the driver call). Afterwards the object is closed, or open again if that free
 * failed. Called with the GIL held. */
static void
wait_for_free(volatile char *freeing)
{
    while (*freeing) {
        Py_BEGIN_ALLOW_THREADS
        sched_yield();
        Py_END_ALLOW_THREADS
    }
}

/* Free the allocation if still open. Returns 0, or -1 with an exception set (the buffer stays open, so
 * that the free can be retried). A close that finds another thread's free in flight waits for it, so
 * that it returns only once the memory is gone (or raises if that free failed and its own retry does). In a forked child nothing is freed: Go must not be entered there, and
 * the memory belongs to the parent's context anyway. */
static int
buffer_free(BufferObject *self, int dealloc)
{
    wait_for_free(&self->freeing);
    if (self->closed) {
        return 0;
    }
    if (self->dlpack_exports > 0) {
        PyErr_Format(PyExc_BufferError,
                     "cannot close a Buffer while %zd DLPack export%s of it (a CuPy/PyTorch/... array made by "
                     "from_dlpack) %s alive; delete %s first",
                     self->dlpack_exports, self->dlpack_exports == 1 ? "" : "s",
                     self->dlpack_exports == 1 ? "is" : "are", self->dlpack_exports == 1 ? "it" : "them");
        return -1;
    }
    if (self->borrowed) {
        self->closed = 1;
        Py_CLEAR(self->owner);
        return 0;
    }
    if (cudacore_forked) {
        if (dealloc) {
            self->closed = 1;
            return 0;
        }
        return door_check_fork("Buffer.close");
    }
    if (self->graph_token == 0 && self->recyclable && recycle_ok() &&
        cc_recycle_free(self->device, self->ptr, self->size, self->stream)) {
        self->closed = 1; /* Go frees it, or accounts for its reuse, before anything else it does */
        return 0;
    }
    char *err;
    int64_t ret;
    PyThreadState *released = NULL;
    if (door_blocking(self->device)) {
        self->freeing = 1;
        released = PyEval_SaveThread();
    }
    if (self->graph_token != 0) {
        err = cudacore_door_GraphFree(self->device, (int64_t)self->ptr, (int64_t)self->size, (int64_t)self->stream,
                                      self->graph_token, &ret);
    } else {
        err = cudacore_door_Free(self->device, (int64_t)self->ptr, (int64_t)self->size, (int64_t)self->stream, &ret);
    }
    if (released != NULL) {
        PyEval_RestoreThread(released);
    }
    self->freeing = 0;
    if (err != NULL) {
        door_raise(err);
        return -1;
    }
    self->closed = 1;
    Py_CLEAR(self->keep); /* freed: its stream may go (this can run its owner's destroy) */
    return 0;
}

static int
buffer_free_dealloc(PyObject *self)
{
    int r = buffer_free((BufferObject *)self, 1);
    Py_CLEAR(((BufferObject *)self)->keep); /* after the free: it may destroy the stream */
    return r;
}

/* The end of an owning object (Buffer, PinnedBuffer): free what it still owns with free_fn, reporting a
 * failure as unraisable (a destructor cannot raise), then clear weak references and release the object. */
static void
dealloc_owner(PyObject *self, int (*free_fn)(PyObject *), PyObject *weakreflist)
{
    PyObject *etype, *evalue, *etb; /* Fetch/Restore rather than GetRaisedException: 3.10 and 3.11 */
    PyErr_Fetch(&etype, &evalue, &etb);
    if (free_fn(self) < 0) {
        PyErr_WriteUnraisable(NULL); /* not self: a hook that kept it would resurrect a freed object */
    }
    PyErr_Restore(etype, evalue, etb);
    if (weakreflist != NULL) {
        PyObject_ClearWeakRefs(self);
    }
    Py_TYPE(self)->tp_free(self);
}

static void
buffer_dealloc(BufferObject *self)
{
    dealloc_owner((PyObject *)self, buffer_free_dealloc, self->weakreflist);
}

static PyObject *
buffer_close(BufferObject *self, PyObject *Py_UNUSED(ignored))
{
    if (buffer_free(self, 0) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
buffer_enter(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    return Py_NewRef(self);
}

static PyObject *
buffer_exit(BufferObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)args;
    (void)nargs;
    if (buffer_free(self, 0) < 0) {
        return NULL;
    }
    Py_RETURN_FALSE;
}

static PyObject *
buffer_get_ptr(BufferObject *self, void *Py_UNUSED(closure))
{
    if (self->closed || self->freeing) {
        return door_closed("Buffer", "cudacore.buffer");
    }
    return PyLong_FromUnsignedLongLong(self->ptr);
}

static PyObject *
buffer_get_owner(BufferObject *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(self->owner != NULL ? self->owner : Py_None);
}

static PyObject *
buffer_get_borrowed(BufferObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->borrowed);
}

/* ---- DLPack export ------------------------------------------------------------------------------------
 * The structs of dlpack.h (v1.0), declared by hand: the ABI is fixed by the spec. A Buffer exports itself
 * as a 1-D uint8 tensor; the capsule's DLManagedTensor holds a reference to the Buffer, dropped by the
 * deleter that the consumer calls when it is done (or by the capsule's destructor if nobody consumed it). */

enum { kDLCUDA = 2, kDLUInt = 1 };

typedef struct {
    int32_t device_type;
    int32_t device_id;
} DLDevice;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

/* One malloc'd block per export: the managed tensor, then shape and strides. */
typedef struct {
    DLManagedTensor m;
    int64_t shape[1];
    int64_t strides[1];
} LegacyExport;

typedef struct {
    DLManagedTensorVersioned m;
    int64_t shape[1];
    int64_t strides[1];
} VersionedExport;

static void
dlpack_release_buffer(void *ctx)
{
    if (ctx == NULL || !Py_IsInitialized()) {
        return;
    }
    /* Consumers may call the deleter from any thread, with or without the GIL. */
    PyGILState_STATE g = PyGILState_Ensure();
    BufferObject *b = (BufferObject *)ctx;
    b->dlpack_exports--;
    Py_DECREF(b);
    PyGILState_Release(g);
}

static void
dlpack_legacy_deleter(DLManagedTensor *m)
{
    dlpack_release_buffer(m->manager_ctx);
    free(m);
}

static void
dlpack_versioned_deleter(DLManagedTensorVersioned *m)
{
    dlpack_release_buffer(m->manager_ctx);
    free(m);
}

static void
dlpack_capsule_destructor(PyObject *capsule)
{
    /* Consumed capsules were renamed used_dltensor[_versioned]; the consumer calls the deleter then. */
    PyObject *etype, *evalue, *etb;
    PyErr_Fetch(&etype, &evalue, &etb);
    if (PyCapsule_IsValid(capsule, "dltensor")) {
        DLManagedTensor *m = (DLManagedTensor *)PyCapsule_GetPointer(capsule, "dltensor");
        if (m != NULL && m->deleter != NULL) {
            m->deleter(m);
        }
    } else if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {
        DLManagedTensorVersioned *m =
            (DLManagedTensorVersioned *)PyCapsule_GetPointer(capsule, "dltensor_versioned");
        if (m != NULL && m->deleter != NULL) {
            m->deleter(m);
        }
    }
    PyErr_Restore(etype, evalue, etb);
}

/* The CUDA stream value of the DLPack spec: None is the legacy default stream (1; 0 means it too), 2 the
 * per-thread default stream, -1 "do not order", anything else a CUstream of the consumer's. */
static int
dlpack_stream_arg(PyObject *arg, int64_t *out)
{
    if (arg == NULL || arg == Py_None) {
        *out = 1;
        return 0;
    }
    if (door_int(arg, "__dlpack__", "stream", out) < 0) {
        return -1;
    }
    if (*out == 0) {
        *out = 1;
    }
    return 0;
}

static PyObject *
buffer_dlpack(BufferObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream_arg = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOO:__dlpack__", kwlist, &stream_arg, &max_version,
                                     &dl_device, &copy)) {
        return NULL;
    }
    if (door_check_fork("__dlpack__") < 0) {
        return NULL;
    }
    if (self->closed || self->freeing) {
        return door_closed("Buffer", "cudacore.dlpack");
    }
    if (copy != Py_None) {
        int want = PyObject_IsTrue(copy);
        if (want < 0) {
            return NULL;
        }
        if (want) {
            PyErr_SetString(PyExc_BufferError, "__dlpack__(copy=True): a cudacore Buffer exports its own memory "
                                               "only; copy it first (cudacore.device_to_device) and export the copy");
            return NULL;
        }
    }
    if (dl_device != Py_None) {
        long long dtype = -1, did = -1;
        if (!PyTuple_Check(dl_device) || PyTuple_GET_SIZE(dl_device) != 2) {
            PyErr_SetString(PyExc_TypeError, "__dlpack__: dl_device must be a (device_type, device_id) tuple");
            return NULL;
        }
        int64_t t64, d64;
        if (door_int(PyTuple_GET_ITEM(dl_device, 0), "__dlpack__", "dl_device[0]", &t64) < 0 ||
            door_int(PyTuple_GET_ITEM(dl_device, 1), "__dlpack__", "dl_device[1]", &d64) < 0) {
            return NULL;
        }
        dtype = t64;
        did = d64;
        if (dtype != kDLCUDA || did != self->device) {
            PyErr_Format(PyExc_BufferError,
                         "__dlpack__: the buffer is on (%d, %lld) (kDLCUDA, device); cannot export to (%lld, %lld)",
                         kDLCUDA, (long long)self->device, dtype, did);
            return NULL;
        }
    }
    int versioned = 0;
    if (max_version != Py_None) {
        if (!PyTuple_Check(max_version) || PyTuple_GET_SIZE(max_version) < 1) {
            PyErr_SetString(PyExc_TypeError, "__dlpack__: max_version must be a (major, minor) tuple or None");
            return NULL;
        }
        int64_t major;
        if (door_int(PyTuple_GET_ITEM(max_version, 0), "__dlpack__", "max_version[0]", &major) < 0) {
            return NULL;
        }
        versioned = major >= 1;
    }
    int64_t consumer;
    if (dlpack_stream_arg(stream_arg, &consumer) < 0) {
        return NULL;
    }
    /* Stream order: the consumer will use the memory on its stream. Go records an event on the buffer's
     * stream and makes the consumer's stream wait on it, under the stream-lifetime and capture rules: the
     * host never waits, and a destroyed stream's handle never reaches the driver. A borrowed buffer's
     * order is its owner's business. */
    if (!no_pending_graph_memory()) {
        /* Graph memory of a graph never launched has no memory behind it: Go refuses its export. */
        int64_t ret;
        char *err = cudacore_door_CheckDLPackExport(self->device, (int64_t)self->ptr, (int64_t)self->size, &ret);
        if (err != NULL) {
            return door_raise(err);
        }
    }
    if (!self->borrowed) {
        int64_t ret;
        char *err = cudacore_door_DLPackOrder(self->device, (int64_t)self->stream, consumer, &ret);
        if (err != NULL) {
            return door_raise(err);
        }
    }
    DLTensor *t;
    void *block;
    const char *name;
    if (versioned) {
        VersionedExport *e = calloc(1, sizeof(VersionedExport));
        if (e == NULL) {
            return PyErr_NoMemory();
        }
        e->m.version.major = 1;
        e->m.version.minor = 0;
        e->m.manager_ctx = self;
        e->m.deleter = dlpack_versioned_deleter;
        e->m.flags = 0;
        e->shape[0] = (int64_t)self->size;
        e->strides[0] = 1;
        t = &e->m.dl_tensor;
        t->shape = e->shape;
        t->strides = e->strides;
        block = e;
        name = "dltensor_versioned";
    } else {
        LegacyExport *e = calloc(1, sizeof(LegacyExport));
        if (e == NULL) {
            return PyErr_NoMemory();
        }
        e->m.manager_ctx = self;
        e->m.deleter = dlpack_legacy_deleter;
        e->shape[0] = (int64_t)self->size;
        e->strides[0] = 1;
        t = &e->m.dl_tensor;
        t->shape = e->shape;
        t->strides = e->strides;
        block = e;
        name = "dltensor";
    }
    t->data = (void *)(uintptr_t)self->ptr;
    t->device.device_type = kDLCUDA;
    t->device.device_id = (int32_t)self->device;
    t->ndim = 1;
    t->dtype.code = kDLUInt;
    t->dtype.bits = 8;
    t->dtype.lanes = 1;
    t->byte_offset = 0;
    PyObject *capsule = PyCapsule_New(block, name, dlpack_capsule_destructor);
    if (capsule == NULL) {
        free(block);
        return NULL;
    }
    /* Only now does the capsule own the block: take the reference its deleter drops. */
    Py_INCREF(self);
    self->dlpack_exports++;
    return capsule;
}

static PyObject *
buffer_dlpack_device(BufferObject *self, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("(iL)", kDLCUDA, (long long)self->device);
}

/* The stream arguments of the Python layer's hot methods, resolved here rather than in Python frames. Set
 * by configure_streams(); until then every stream object takes the Python path. */
static PyObject *handles_dict;     /* cudacore._handles' module dict: its open_stream_blocks count */
static PyObject *stream_resolver;  /* cudacore._handles.stream_handle(stream, device) -> int */
static PyObject *capture_noter;    /* cudacore._stream.note_capture_buffers(buffers) */
static PyObject *str_open_blocks;
static PyObject *str_current;      /* "_current": cudacore._handles' thread-local current state */
static PyObject *str_streams;      /* "streams": its per-device current streams */

static PyObject *capturing_set; /* cudacore._stream.capturing_streams: nonempty while any stream captures */


/* Direct reads of the __slots__ the direct path checks. A __slots__ attribute of a Python class is a
 * member at a fixed offset of its instances; reading it there costs a load where PyObject_GetAttr costs a
 * lookup through the type, a noticeable share of a launch. configure_slots() records each offset from the
 * class's member descriptor, and a read is made only on an instance of that exact class (Py_TYPE checked),
 * so the offset is the instance's. An unset slot reads NULL. */
typedef struct {
    PyTypeObject *type; /* the exact class; NULL until configure_slots() */
    Py_ssize_t offsets[4];
} slot_layout;
static slot_layout stream_slots;  /* _owned, _closed, _handle, _device */
static slot_layout device_slots;  /* _ordinal */
static slot_layout graph_slots;   /* _exec, _device */
static slot_layout kernel_slots;  /* _direct, _module, _spec */
static slot_layout module_slots;  /* _loaded, _device */
static slot_layout kernel_arg_slots; /* KernelArg: _code, _raw */
enum { S_OWNED = 0, S_CLOSED = 1, S_HANDLE = 2, S_DEVICE = 3 };

/* Slot i of o (borrowed, may be NULL), or NULL when o is not an instance of the layout's exact class. */
static inline PyObject *
slot_of(const slot_layout *l, PyObject *o, int i)
{
    if (l->type == NULL || Py_TYPE(o) != l->type) {
        return NULL;
    }
    return *(PyObject **)((char *)o + l->offsets[i]);
}

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

/* The ordinal of the Device in slot i of o, or -1. */
static inline int64_t
ordinal_in(const slot_layout *l, PyObject *o, int i)
{
    PyObject *dev = slot_of(l, o, i);
    return dev != NULL ? int_of(slot_of(&device_slots, dev, 0)) : -1;
}

/* Record the layout of class type for the names given: 0, or -1 with an exception (a name that is not a
 * __slots__ member of type). */
static int
layout_of(slot_layout *l, PyObject *type, const char *const *names, int n)
{
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "configure_slots() takes classes");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        PyObject *d = PyObject_GetAttrString(type, names[i]);
        if (d == NULL) {
            return -1;
        }
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type) && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
        Py_ssize_t off = ok ? ((PyMemberDescrObject *)d)->d_member->offset : 0;
        Py_DECREF(d);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a __slots__ member", ((PyTypeObject *)type)->tp_name, names[i]);
            return -1;
        }
        l->offsets[i] = off;
    }
    Py_XSETREF(l->type, (PyTypeObject *)Py_NewRef(type));
    return 0;
}

/* The handle of a cudacore Stream the direct path may use for work of device `device`, or 0 when the work
 * must go through Go: the Stream must be of the exact class, own its driver stream (its close() marks it
 * closed, with the GIL held, before destroying it), be open, be of the device, and no stream of cudacore may
 * capture (a capture's rules and bookkeeping live in Go). The caller holds the GIL until the driver has the
 * call. Never sets an exception. */
static uint64_t
direct_stream(PyObject *stream, int64_t device)
{
    if (capturing_set == NULL || PySet_GET_SIZE(capturing_set) != 0 || !direct_enabled(device) ||
        slot_of(&stream_slots, stream, S_OWNED) != Py_True || slot_of(&stream_slots, stream, S_CLOSED) != Py_False ||
        ordinal_in(&stream_slots, stream, S_DEVICE) != device) {
        return 0;
    }
    int64_t handle = int_of(slot_of(&stream_slots, stream, S_HANDLE));
    return handle > 0 ? (uint64_t)handle : 0;
}

/* The handle of stream, a cudacore Stream (of the exact class) of device `device`, for a call through Go,
 * which checks it is alive; -1 for anything else (the general path decides). Never sets an exception. */
static int64_t
stream_handle_on(PyObject *stream, int64_t device)
{
    if (ordinal_in(&stream_slots, stream, S_DEVICE) != device) {
        return -1;
    }
    return int_of(slot_of(&stream_slots, stream, S_HANDLE));
}

/* The hot case of Buffer.copy_from / copy_to: a PinnedBuffer, all of it, on a cudacore Stream of the
 * buffer's device. The copy takes the direct path when it may (direct_stream), and otherwise, up to
 * held_max bytes, the generated door of CopyToDeviceHeld/CopyToHostHeld, with the pinned memory itself
 * (cudacore's own allocation: no buffer export needed). 1 done, 0 not the hot case (nothing done), -1
 * error set. */
static int
copy_hot(BufferObject *self, PyObject *host, PyObject *stream, int to_device)
{
    if (stream_type == NULL || Py_TYPE(stream) != stream_type || !PyObject_TypeCheck(host, &PinnedType) ||
        self->closed || self->freeing) {
        return 0;
    }
    PinnedObject *h = (PinnedObject *)host;
    if (h->closed || h->freeing || h->size > self->size) {
        return 0;
    }
    if (door_check_fork(to_device ? "copy_from" : "copy_to") < 0) {
        return -1;
    }
    /* Direct, any size: the driver only enqueues a copy from pinned memory, with the GIL held throughout. */
    uint64_t direct = no_pending_graph_memory() ? direct_stream(stream, self->device) : 0;
    if (direct != 0 &&
        (to_device ? direct_copy_to_device(self->device, self->ptr, (const void *)(uintptr_t)h->ptr, (size_t)h->size, direct)
                   : direct_copy_to_host(self->device, (void *)(uintptr_t)h->ptr, self->ptr, (size_t)h->size, direct))) {
        return 1;
    }
    /* Through Go with the GIL held up to held_max bytes; a larger copy goes to the general path, which
     * releases the GIL with the memory held by its buffer export. */
    if ((Py_ssize_t)h->size > held_max) {
        return 0;
    }
    int64_t sh = stream_handle_on(stream, self->device);
    if (sh < 0) {
        return 0;
    }
    int64_t ret;
    char *err = to_device ? cudacore_door_CopyToDeviceHeld(self->device, (int64_t)self->ptr, (const void *)(uintptr_t)h->ptr,
                                                           (int64_t)h->size, (int64_t)h->size, sh, &ret)
                          : cudacore_door_CopyToHostHeld(self->device, (void *)(uintptr_t)h->ptr, (int64_t)h->size,
                                                         (int64_t)self->ptr, (int64_t)h->size, sh, &ret);
    if (err != NULL) {
        door_raise(err);
        return -1;
    }
    return 1;
}

/* Whether stream=None means the synchronous copy on the legacy stream: no `with stream:` block is open
 * anywhere (cudacore._handles.open_stream_blocks is 0). */
static int
no_stream_blocks(void)
{
    if (handles_dict == NULL) {
        return 0;
    }
    PyObject *n = PyDict_GetItemWithError(handles_dict, str_open_blocks); /* borrowed */
    if (n == NULL) {
        PyErr_Clear();
        return 0;
    }
    return PyLong_CheckExact(n) && PyLong_AsLong(n) == 0;
}

/* The hot case of copy_from / copy_to with host memory of the buffer protocol (a PinnedBuffer too, not a
 * device Buffer), as the general path sizes it, through the CopyToDevice / CopyToHost door as the general
 * path would call it: on stream, whose handle is sh, or synchronously for stream NULL and sh -1. A
 * synchronous copy releases the GIL; one on a stream keeps it up to held_max bytes (the Held doors, or the
 * direct path for a host-to-device copy the driver stages), as the general path does. The host memory is
 * held through its buffer export for the call, so a PinnedBuffer cannot be closed by another thread
 * meanwhile (its close refuses while exports live). 1 done, 0 not this case (nothing done, no exception),
 * -1 error set. */
static int
copy_export_hot(BufferObject *self, PyObject *host, PyObject *stream, int64_t sh, int to_device)
{
    if (self->closed || self->freeing || PyObject_TypeCheck(host, &BufferType) || !PyObject_CheckBuffer(host)) {
        return 0;
    }
    Py_buffer view;
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (to_device ? 0 : PyBUF_WRITABLE);
    if (PyObject_GetBuffer(host, &view, flags) < 0) {
        PyErr_Clear(); /* the general path says what is wrong */
        return 0;
    }
    /* copy_from copies all of host into the buffer's start; copy_to all of the buffer into host's start. */
    uint64_t want = to_device ? (uint64_t)view.len : self->size;
    if ((view.format != NULL && strchr(view.format, 'O') != NULL) ||
        (to_device ? want > self->size : (uint64_t)view.len < want)) {
        PyBuffer_Release(&view);
        return 0;
    }
    if (door_check_fork(to_device ? "copy_from" : "copy_to") < 0) {
        PyBuffer_Release(&view);
        return -1;
    }
    int64_t ret;
    char *err;
    int64_t device = self->device, ptr = (int64_t)self->ptr, n = (int64_t)want;
    if (sh >= 0 && n <= held_max) {
        /* Direct when the stream manager would hand this copy to the driver's own pageable copy (which
         * stages it and returns once it has read the host memory; memory the driver knows as pinned is
         * read when the stream gets there, as documented for pinned memory). */
        uint64_t direct;
        if (to_device && direct_pageable(device, (size_t)n) && no_pending_graph_memory() &&
            (direct = direct_stream(stream, device)) != 0 &&
            direct_copy_to_device(device, (uint64_t)ptr, view.buf, (size_t)n, direct)) {
            PyBuffer_Release(&view);
            return 1;
        }
        err = to_device ? cudacore_door_CopyToDeviceHeld(device, ptr, view.buf, (int64_t)view.len, n, sh, &ret)
                        : cudacore_door_CopyToHostHeld(device, view.buf, (int64_t)view.len, ptr, n, sh, &ret);
    } else {
        Py_BEGIN_ALLOW_THREADS
        err = to_device ? cudacore_door_CopyToDevice(device, ptr, view.buf, (int64_t)view.len, n, sh, &ret)
                        : cudacore_door_CopyToHost(device, view.buf, (int64_t)view.len, ptr, n, sh, &ret);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    if (err != NULL) {
        door_raise(err);
        return -1;
    }
    return 1;
}

/* The synchronous hot case: stream=None while no `with stream:` block is open (see copy_export_hot). */
static int
copy_sync_hot(BufferObject *self, PyObject *host, int to_device)
{
    return no_stream_blocks() ? copy_export_hot(self, host, NULL, -1, to_device) : 0;
}

/* The asynchronous hot case past copy_hot: a cudacore Stream of the buffer's device and host memory of the
 * buffer protocol, pageable or pinned (see copy_export_hot). */
static int
copy_stream_hot(BufferObject *self, PyObject *host, PyObject *stream, int to_device)
{
    int64_t sh = stream_handle_on(stream, self->device);
    return sh < 0 ? 0 : copy_export_hot(self, host, stream, sh, to_device);
}

/* copy_from(host, stream=None) / copy_to(host, stream=None): the hot case in C, anything else through the
 * subclass's _copy_from / _copy_to (python/cudacore/_memory.py), whose checks and errors are the
 * general ones. */
static PyObject *
buffer_copy(BufferObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, int to_device)
{
    const char *general = to_device ? "_copy_from" : "_copy_to";
    Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *host = NULL, *stream = Py_None;
    if (nargs >= 1 && nargs <= 2 && nkw == 0) {
        host = args[0];
        stream = nargs == 2 ? args[1] : Py_None;
    } else if (nargs == 1 && nkw == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "stream") == 0) {
        host = args[0];
        stream = args[1];
    }
    if (host != NULL) {
        int r = stream == Py_None ? copy_sync_hot(self, host, to_device) : copy_hot(self, host, stream, to_device);
        if (r == 0 && stream != Py_None) {
            r = copy_stream_hot(self, host, stream, to_device);
        }
        if (r < 0) {
            return NULL;
        }
        if (r > 0) {
            Py_RETURN_NONE;
        }
    }
    PyObject *name = PyUnicode_FromString(general);
    if (name == NULL) {
        return NULL;
    }
    /* Forward the call as it came: self first, then the caller's arguments and keywords. */
    PyObject *stack[4];
    Py_ssize_t total = nargs + nkw;
    if (total > 3) {
        Py_DECREF(name);
        PyErr_Format(PyExc_TypeError, "%s() takes at most 2 arguments (%zd given)", to_device ? "copy_from" : "copy_to", total);
        return NULL;
    }
    stack[0] = (PyObject *)self;
    for (Py_ssize_t i = 0; i < total; i++) {
        stack[i + 1] = args[i];
    }
    PyObject *r = PyObject_VectorcallMethod(name, stack, (size_t)(nargs + 1), kwnames);
    Py_DECREF(name);
    return r;
}

static PyObject *
buffer_copy_from(BufferObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return buffer_copy(self, args, nargs, kwnames, 1);
}

static PyObject *
buffer_copy_to(BufferObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return buffer_copy(self, args, nargs, kwnames, 0);
}

/* Buffer._void(): mark the buffer closed without freeing anything: its memory was never allocated by the
 * driver (graph memory of a capture that was aborted, or of a graph destroyed before its first launch),
 * and the address may belong to a later allocation. */
static PyObject *
buffer_void(BufferObject *self, PyObject *Py_UNUSED(ignored))
{
    wait_for_free(&self->freeing);
    self->closed = 1;
    Py_CLEAR(self->keep);
    Py_RETURN_NONE;
}

static PyMethodDef buffer_methods[] = {
    {"_void", (PyCFunction)buffer_void, METH_NOARGS,
     "_void()\n\nMark closed without freeing: the driver never allocated this graph memory (cudacore internal)."},
    {"copy_from", (PyCFunction)(void (*)(void))buffer_copy_from, METH_FASTCALL | METH_KEYWORDS,
     "copy_from(host, stream=None)\n\nCopy host memory (bytes-like, numpy, PinnedBuffer) into this buffer; "
     "with a stream, ordered on it."},
    {"copy_to", (PyCFunction)(void (*)(void))buffer_copy_to, METH_FASTCALL | METH_KEYWORDS,
     "copy_to(host, stream=None)\n\nCopy this buffer into writable host memory; with a stream, ordered on it."},
    {"__dlpack__", (PyCFunction)(void (*)(void))buffer_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)\n\n"
     "A DLPack capsule of this buffer as a 1-D uint8 tensor (versioned, DLPack 1.0, when max_version >= "
     "(1, 0)). It keeps the buffer alive until the consumer deletes it; close() is refused meanwhile. When "
     "the consumer's stream is not the buffer's, the consumer's stream is made to wait for the buffer's work "
     "with an event (stream=-1: no ordering); the host does not wait."},
    {"__dlpack_device__", (PyCFunction)buffer_dlpack_device, METH_NOARGS,
     "__dlpack_device__() -> (2, device_id): kDLCUDA and the device ordinal."},
    {"close", (PyCFunction)buffer_close, METH_NOARGS,
     "close()\n\nFree the memory, in stream order on the buffer's stream. Idempotent."},
    {"__enter__", (PyCFunction)buffer_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))buffer_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

/* Plain fields are members; only what computes or checks (ptr raises once closed) is a getter. */
static PyMemberDef buffer_members[] = {
    {"size", T_ULONGLONG, offsetof(BufferObject, size), READONLY, "The size in bytes."},
    {"device_id", T_LONGLONG, offsetof(BufferObject, device), READONLY, "The ordinal of the device it lives on."},
    {"stream_handle", T_ULONGLONG, offsetof(BufferObject, stream), READONLY,
     "The driver handle of the stream it is ordered on (1: the legacy default stream)."},
    {"closed", T_BOOL, offsetof(BufferObject, closed), READONLY, "Whether close() has freed it."},
    {"_graph_token", T_LONGLONG, offsetof(BufferObject, graph_token), 0,
     "Go's owner token of an allocation made during a capture, 0 otherwise (cudacore internal)."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef buffer_getset[] = {
    {"ptr", (getter)buffer_get_ptr, NULL, "The device address (raises once the buffer is closed).", NULL},
    {"owner", (getter)buffer_get_owner, NULL,
     "For a borrowed buffer (an ExternalBuffer), the object owning the memory; None otherwise.", NULL},
    {"borrowed", (getter)buffer_get_borrowed, NULL,
     "Whether this buffer views memory another library owns (close() then frees nothing).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject BufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudacore._fast.Buffer",
    .tp_basicsize = sizeof(BufferObject),
    .tp_dealloc = (destructor)buffer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Device memory owned by this object; made by Device.allocate.",
    .tp_weaklistoffset = offsetof(BufferObject, weakreflist),
    .tp_methods = buffer_methods,
    .tp_members = buffer_members,
    .tp_getset = buffer_getset,
};

/* ---------------------------------------------------------------------------------------------------- */
/* PinnedBuffer: page-locked host memory with the buffer protocol                                      */


/* Free the host memory if still open: as buffer_free (a failed free leaves it open; a forked child
 * frees nothing). */
static int
pinned_free(PinnedObject *self, int dealloc)
{
    wait_for_free(&self->freeing);
    if (self->closed) {
        return 0;
    }
    if (self->exports > 0) {
        PyErr_Format(PyExc_BufferError,
                     "cannot close a PinnedBuffer while %zd view%s of it (memoryview, numpy array) exist%s",
                     self->exports, self->exports == 1 ? "" : "s", self->exports == 1 ? "s" : "");
        return -1;
    }
    if (cudacore_forked) {
        if (dealloc) {
            self->closed = 1;
            return 0;
        }
        return door_check_fork("PinnedBuffer.close");
    }
    char *err;
    int64_t ret;
    self->freeing = 1;
    Py_BEGIN_ALLOW_THREADS /* cuMemFreeHost synchronizes the device */
    err = cudacore_door_PinnedFree(self->device, (int64_t)self->ptr, dealloc, &ret);
    Py_END_ALLOW_THREADS
    self->freeing = 0;
    if (err != NULL) {
        door_raise(err);
        return -1;
    }
    self->closed = 1;
    return 0;
}

static int
pinned_free_dealloc(PyObject *self)
{
    return pinned_free((PinnedObject *)self, 1);
}

static void
pinned_dealloc(PinnedObject *self)
{
    /* No view can exist here: each holds a reference to this object. */
    dealloc_owner((PyObject *)self, pinned_free_dealloc, self->weakreflist);
}

static int
pinned_getbuffer(PinnedObject *self, Py_buffer *view, int flags)
{
    if (self->closed || self->freeing) { /* a free in flight: no new view of memory that is going */
        door_closed("PinnedBuffer", "cudacore.pinned");
        view->obj = NULL;
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)self, (void *)(uintptr_t)self->ptr, (Py_ssize_t)self->size, 0,
                          flags) < 0) {
        return -1;
    }
    self->exports++;
    return 0;
}

static void
pinned_releasebuffer(PinnedObject *self, Py_buffer *Py_UNUSED(view))
{
    self->exports--;
}

static PyBufferProcs pinned_as_buffer = {
    .bf_getbuffer = (getbufferproc)pinned_getbuffer,
    .bf_releasebuffer = (releasebufferproc)pinned_releasebuffer,
};

static PyObject *
pinned_close(PinnedObject *self, PyObject *Py_UNUSED(ignored))
{
    if (pinned_free(self, 0) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
pinned_exit(PinnedObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)args;
    (void)nargs;
    if (pinned_free(self, 0) < 0) {
        return NULL;
    }
    Py_RETURN_FALSE;
}

static PyObject *
pinned_get_ptr(PinnedObject *self, void *Py_UNUSED(closure))
{
    if (self->closed || self->freeing) {
        return door_closed("PinnedBuffer", "cudacore.pinned");
    }
    return PyLong_FromUnsignedLongLong(self->ptr);
}

static PyMethodDef pinned_methods[] = {
    {"close", (PyCFunction)pinned_close, METH_NOARGS,
     "close()\n\nFree the host memory. Idempotent; refused while views of it exist."},
    {"__enter__", (PyCFunction)buffer_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))pinned_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef pinned_members[] = {
    {"size", T_ULONGLONG, offsetof(PinnedObject, size), READONLY, "The size in bytes."},
    {"device_id", T_LONGLONG, offsetof(PinnedObject, device), READONLY,
     "The ordinal of the device it was allocated for."},
    {"closed", T_BOOL, offsetof(PinnedObject, closed), READONLY, "Whether close() has freed it."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef pinned_getset[] = {
    {"ptr", (getter)pinned_get_ptr, NULL, "The host address (raises once closed).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PinnedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudacore._fast.PinnedBuffer",
    .tp_basicsize = sizeof(PinnedObject),
    .tp_dealloc = (destructor)pinned_dealloc,
    .tp_as_buffer = &pinned_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Page-locked host memory owned by this object; made by Device.allocate_pinned.",
    .tp_weaklistoffset = offsetof(PinnedObject, weakreflist),
    .tp_methods = pinned_methods,
    .tp_members = pinned_members,
    .tp_getset = pinned_getset,
};

/* ---------------------------------------------------------------------------------------------------- */
/* Python stacks for allocations (asked for with set_stack_frames)                                     */

/* stack_frames > 0: after each successful allocate(), the innermost stack_frames Python frames outside
 * stack_skip (cudacore's own package directory) are sent to Go as the allocation's label
 * (MemoryLabel). 0, the default, costs one load per allocation. Written with the GIL held only. */
static int stack_frames;
static char stack_skip[1024];

static void
label_allocation(int64_t device, int64_t ptr)
{
    char label[2048];
    size_t used = 0;
    int taken = 0;
    size_t skip_len = strlen(stack_skip);
    PyFrameObject *f = PyEval_GetFrame(); /* borrowed */
    Py_XINCREF(f);
    while (f != NULL && taken < stack_frames) {
        PyCodeObject *code = PyFrame_GetCode(f);
        const char *file = PyUnicode_AsUTF8(code->co_filename);
        const char *name = PyUnicode_AsUTF8(code->co_name);
        if (file == NULL || name == NULL) {
            PyErr_Clear();
        } else if (skip_len == 0 || strncmp(file, stack_skip, skip_len) != 0) {
            int n = snprintf(label + used, sizeof label - used, "%s%s:%d in %s", used ? "\n" : "", file,
                             PyFrame_GetLineNumber(f), name);
            if (n < 0 || (size_t)n >= sizeof label - used) {
                label[used] = 0; /* the frame that does not fit is left out whole */
                Py_DECREF(code);
                break;
            }
            used += (size_t)n;
            taken++;
        }
        Py_DECREF(code);
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    Py_XDECREF(f);
    label[used] = 0;
    int64_t ok = 0;
    char *err = cudacore_door_MemoryLabel(device, ptr, label, &ok);
    free(err); /* a label is best effort: an allocation never fails for want of one */
}

PyDoc_STRVAR(set_stack_frames_doc, "set_stack_frames(frames: int, skip: str) -> int\n\n"
                                   "Label each allocation with its innermost Python frames (0: off), leaving out "
                                   "files under skip; returns the previous count.");

static PyObject *
fast_set_stack_frames(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyLong_Check(args[0]) || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "set_stack_frames(frames: int, skip: str)");
        return NULL;
    }
    long n = PyLong_AsLong(args[0]);
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (n < 0 || n > 64) {
        PyErr_Format(PyExc_ValueError, "frames must be between 0 and 64, got %ld", n);
        return NULL;
    }
    const char *skip = PyUnicode_AsUTF8(args[1]);
    if (skip == NULL) {
        return NULL;
    }
    if (strlen(skip) >= sizeof stack_skip) {
        PyErr_SetString(PyExc_ValueError, "skip is too long");
        return NULL;
    }
    int prev = stack_frames;
    strcpy(stack_skip, skip);
    stack_frames = (int)n;
    return PyLong_FromLong(prev);
}

/* ---------------------------------------------------------------------------------------------------- */
/* Module functions                                                                                     */


static PyObject *current_stream_object(int64_t device); /* defined below */

/* The handle of a stream argument (a Stream, an int handle, or None: the current stream of device), as
 * cudacore._handles.stream_handle gives it, and whether it names an open Stream this process owns
 * (*owned). The common cases (None, a Stream, a non-negative int) cost no Python frame; everything else,
 * errors included, is stream_handle's. 0, or -1 with an exception set. */
static int
resolve_stream(PyObject *stream, int64_t device, const char *fn, int64_t *out, int *owned)
{
    *owned = 0;
    if (stream == Py_None && handles_dict != NULL) {
        PyObject *n = PyDict_GetItemWithError(handles_dict, str_open_blocks); /* borrowed */
        if (n == NULL && PyErr_Occurred()) {
            return -1;
        }
        if (n == NULL || (PyLong_CheckExact(n) && PyLong_AsLong(n) == 0)) {
            *out = 0;
            return 0;
        }
        /* A `with stream:` block is open somewhere: this thread's current Stream of the device, read where
         * cudacore._handles keeps it; a closed one (or none readable) goes to the resolver, which explains. */
        PyObject *cur = current_stream_object(device);
        if (cur == NULL && PyErr_Occurred()) {
            return -1;
        }
        if (cur == Py_None) {
            Py_DECREF(cur);
            *out = 0;
            return 0;
        }
        if (cur != NULL) {
            int64_t h = slot_of(&stream_slots, cur, S_CLOSED) == Py_False ? int_of(slot_of(&stream_slots, cur, S_HANDLE)) : -1;
            *owned = h > 0 && slot_of(&stream_slots, cur, S_OWNED) == Py_True;
            Py_DECREF(cur);
            if (h >= 0) {
                *out = h;
                return 0;
            }
        }
    } else if (slot_of(&stream_slots, stream, S_HANDLE) != NULL) {
        *owned = slot_of(&stream_slots, stream, S_OWNED) == Py_True && slot_of(&stream_slots, stream, S_CLOSED) == Py_False;
        return door_int(slot_of(&stream_slots, stream, S_HANDLE), fn, "stream", out);
    } else if (PyLong_CheckExact(stream)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(stream, &overflow);
        if (overflow == 0 && v >= 0) {
            *out = v;
            return 0;
        }
        PyErr_Clear(); /* the resolver names the argument and its range */
    }
    if (stream_resolver == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cudacore._fast is not configured");
        return -1;
    }
    PyObject *args[2] = {stream, NULL};
    args[1] = PyLong_FromLongLong(device);
    if (args[1] == NULL) {
        return -1;
    }
    PyObject *h = PyObject_Vectorcall(stream_resolver, args, 2, NULL);
    Py_DECREF(args[1]);
    if (h == NULL) {
        return -1;
    }
    int r = door_int(h, fn, "stream", out);
    Py_DECREF(h);
    return r;
}

/* This thread's current stream of device `device` as cudacore._handles keeps it (the `streams` dict of its
 * thread-local `_current`): a new reference to the Stream, Py_None for the legacy default stream, or NULL
 * when it cannot be read here (no exception set) or on an error (exception set). Reading a thread-local
 * may run _Current.__init__ on a thread's first use: callers resolve the stream before the checks that the
 * direct path makes with the GIL held. */
static PyObject *
current_stream_object(int64_t device)
{
    if (handles_dict == NULL || str_current == NULL) {
        return NULL;
    }
    PyObject *local = PyDict_GetItemWithError(handles_dict, str_current); /* borrowed */
    if (local == NULL) {
        return NULL;
    }
    PyObject *streams = PyObject_GetAttr(local, str_streams);
    if (streams == NULL) {
        return NULL;
    }
    PyObject *key = PyLong_FromLongLong(device);
    PyObject *cur = NULL;
    if (key != NULL && PyDict_CheckExact(streams)) {
        cur = PyDict_GetItemWithError(streams, key); /* borrowed */
        cur = cur != NULL ? Py_NewRef(cur) : PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    }
    Py_XDECREF(key);
    Py_DECREF(streams);
    return cur;
}

/* The stream a call with stream=None works on, for the direct path: this thread's current Stream of the
 * device while a `with stream:` block is open anywhere, else NULL (the legacy default stream, which the
 * direct path does not take). A new reference, or NULL; never sets an exception. */
static PyObject *
current_for_direct(int64_t device)
{
    if (no_stream_blocks()) {
        return NULL;
    }
    PyObject *cur = current_stream_object(device);
    if (cur == NULL) {
        PyErr_Clear();
        return NULL;
    }
    if (cur == Py_None) {
        Py_DECREF(cur);
        return NULL;
    }
    return cur;
}

/* Hand new device buffers to the capture bookkeeping of the Python layer while any stream captures (a
 * buffer allocated on a capturing stream is graph memory, which the graph's end may void). 0, or -1. */
static int
note_if_capturing(PyObject *buf)
{
    if (capturing_set == NULL || PySet_GET_SIZE(capturing_set) == 0) {
        return 0;
    }
    PyObject *tuple = PyTuple_Pack(1, buf);
    if (tuple == NULL) {
        return -1;
    }
    PyObject *r = PyObject_CallOneArg(capture_noter, tuple);
    Py_DECREF(tuple);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* Whether the recycle log (recycle.h) may serve a Buffer's free or allocation now, as far as the Python
 * layer's state goes: no stream captures or is about to (begin_capture lists its stream before the
 * driver begins, and end_capture removes it after Go has ended it), and allocations are not labelled
 * with Python stacks (a recycled allocation has no label). Go's conditions are in cc_recycle_max. */
static int
recycle_ok(void)
{
    return capturing_set != NULL && PySet_GET_SIZE(capturing_set) == 0 && stack_frames == 0;
}

/* Whether a Buffer on stream handle stream may recycle, whoever named it: the legacy stream, the one
 * default stream whose handle means the same stream on every thread (per-thread default streams share one
 * handle across threads). A stream cudacore created may recycle too, when the allocation named it by its
 * open Stream object (resolve_stream's owned): its handle names it until Stream.close(), whose door replays
 * the log (every free logged on it becomes a free through Go) before the stream is destroyed; a Buffer of
 * it closed later logs a free that Go orders on the legacy stream, the stream having been synchronized
 * when it was destroyed. Handles of other libraries' streams never recycle: their owner may destroy them
 * behind cudacore's back, and the driver hands the handle to the next stream. */
static int
recyclable_stream(int64_t stream)
{
    return stream == 0 || stream == 1;
}

/* Allocate through the Allocate door into a new Buffer of the configured class; on the legacy stream, from
 * the recycle log when it holds a free of the same size on the same stream. */
/* Give device's orphans back to its allocator (the MemoryFlushOrphans door), without the GIL: the device
 * synchronize it makes may wait for work that needs the GIL (a host callback). The bytes given back; 0 on
 * a failure, which the allocation's own error then reports. */
static int64_t
flush_orphans(int64_t device)
{
    int64_t n = 0;
    char *err;
    Py_BEGIN_ALLOW_THREADS
    err = cudacore_door_MemoryFlushOrphans(device, &n);
    Py_END_ALLOW_THREADS
    if (err != NULL) {
        free(err);
        return 0;
    }
    return n;
}

/* The Allocate door, under the device's GIL policy (door_blocking: released where the allocator can block). */
static char *
door_allocate(int64_t device, int64_t size, int64_t stream, int64_t *token, int64_t *ptr)
{
    char *err;
    if (door_blocking(device)) {
        Py_BEGIN_ALLOW_THREADS
        err = cudacore_door_Allocate(device, size, stream, token, (int64_t)sizeof *token, ptr);
        Py_END_ALLOW_THREADS
    } else {
        err = cudacore_door_Allocate(device, size, stream, token, (int64_t)sizeof *token, ptr);
    }
    return err;
}

static PyObject *
allocate_buffer(int64_t device, int64_t size, int64_t stream, int owned)
{
    int64_t ptr = 0;
    if (buffer_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cudacore._fast is not configured");
        return NULL;
    }
    /* Make the object first: if Python is out of memory, nothing on the device has to be undone. */
    BufferObject *b = (BufferObject *)buffer_type->tp_alloc(buffer_type, 0);
    if (b == NULL) {
        return NULL;
    }
    b->recyclable = (char)(size > 0 && (recyclable_stream(stream) || owned));
    if (b->recyclable && recycle_ok()) {
        uint64_t p = cc_recycle_take(device, (uint64_t)size, (uint64_t)stream);
        if (p != 0) {
            b->ptr = p;
            b->size = (uint64_t)size;
            b->stream = (uint64_t)stream;
            b->device = device;
            return (PyObject *)b;
        }
    }
    b->closed = 1; /* until the allocation succeeds, dealloc must not free anything */
    int64_t token = 0; /* taken with the allocation: looked up later, it could be a newer owner's */
    char *err = door_allocate(device, size, stream, &token, &ptr);
    if (err != NULL && strncmp(err, "cuda[2 ", 7) == 0 && flush_orphans(device) > 0) {
        /* Out of memory while orphans waited (blocks of other libraries' streams, freed and waiting for a
         * device synchronize): they are back in the allocator now; try once more. */
        free(err);
        err = door_allocate(device, size, stream, &token, &ptr);
    }
    if (err != NULL) {
        Py_DECREF(b);
        return door_raise(err);
    }
    b->graph_token = token;
    b->ptr = (uint64_t)ptr;
    b->size = (uint64_t)size;
    b->stream = (uint64_t)stream;
    b->device = device;
    b->closed = 0;
    if (stack_frames > 0) {
        label_allocation(device, ptr);
    }
    return (PyObject *)b;
}

PyDoc_STRVAR(allocate_doc, "allocate(device: int, size: int, stream: int) -> Buffer\n\n"
                           "Allocate size bytes on device, ordered on the stream handle (0: legacy).");

static PyObject *
fast_allocate(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    int64_t device, size, stream;
    if (door_enter("allocate", nargs, 3) < 0 || door_int(args[0], "allocate", "device", &device) < 0 ||
        door_int(args[1], "allocate", "size", &size) < 0 || door_int(args[2], "allocate", "stream", &stream) < 0) {
        return NULL;
    }
    return allocate_buffer(device, size, stream, 0);
}

PyDoc_STRVAR(device_allocate_doc, "device_allocate(device: int, size: int, stream) -> Buffer\n\n"
                                  "Device.allocate: the stream argument as the Python layer takes it (a Stream, "
                                  "an int handle, or None for the current stream), and a buffer allocated while "
                                  "a stream captures handed to the capture bookkeeping.");

static PyObject *
fast_device_allocate(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    int64_t device, size, stream;
    int owned;
    if (door_enter("allocate", nargs, 3) < 0 || door_int(args[0], "allocate", "device", &device) < 0 ||
        door_int(args[1], "allocate", "size", &size) < 0 || resolve_stream(args[2], device, "allocate", &stream, &owned) < 0) {
        return NULL;
    }
    PyObject *b = allocate_buffer(device, size, stream, owned);
    PyObject *sa = args[2];
    if (b != NULL && sa != Py_None && !PyLong_Check(sa) && slot_of(&stream_slots, sa, S_HANDLE) == NULL) {
        ((BufferObject *)b)->keep = Py_NewRef(sa); /* another library's stream object: alive until the free */
    }
    if (b != NULL && note_if_capturing(b) < 0) {
        Py_DECREF(b); /* the allocation is freed with the object */
        return NULL;
    }
    return b;
}

PyDoc_STRVAR(configure_direct_doc, "configure_direct(device: int, kind: int, ctx: int, table: int, pageable_max: int) -> None\n\n"
                                   "How the direct path reaches the device's driver, as cudacore's DirectInfo reports "
                                   "it (kind 0 off, 1 the real driver, 2 the simulator), and the largest pageable "
                                   "host-to-device copy that goes to the driver's own pageable copy (negative: none).");

static PyObject *
fast_configure_direct(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    int64_t v[5];
    static const char *names[5] = {"device", "kind", "ctx", "table", "pageable_max"};
    if (door_enter("configure_direct", nargs, 5) < 0) {
        return NULL;
    }
    for (int i = 0; i < 5; i++) {
        if (door_int(args[i], "configure_direct", names[i], &v[i]) < 0) {
            return NULL;
        }
    }
    (void)direct_configure(v[0], (int)v[1], (uint64_t)v[2], (uint64_t)v[3], v[4]); /* beyond the table: through Go */
    Py_RETURN_NONE;
}

/* Graph.launch on the direct path (see graph_launch_direct_doc): 1 launched, 0 not taken. Never sets an
 * exception. */
static int
graph_direct(PyObject *graph, PyObject *stream)
{
    int64_t exec = int_of(slot_of(&graph_slots, graph, 0));
    int64_t device = ordinal_in(&graph_slots, graph, 1);
    if (exec <= 0 || device < 0 || cudacore_forked) {
        return 0;
    }
    PyObject *cur = stream == NULL || stream == Py_None ? current_for_direct(device) : Py_NewRef(stream);
    if (cur == NULL) {
        return 0;
    }
    /* From here to the driver's call no Python code runs: the checks hold until the launch. */
    uint64_t handle = direct_stream(cur, device);
    int r = handle != 0 && direct_graph_launch(device, (uint64_t)exec, handle);
    Py_DECREF(cur);
    return r;
}

PyDoc_STRVAR(graph_launch_direct_doc, "graph_launch_direct(graph, stream) -> bool\n\n"
                                      "Graph.launch on the direct path: launch graph._exec, the executable graph "
                                      "that GraphLaunch handed out, on stream from C. The checks (direct_stream) and "
                                      "the driver call happen with the GIL held throughout, so no other thread can "
                                      "close the stream or destroy the graph in between. False when not taken: the "
                                      "caller launches through Go, which checks and reports.");

static PyObject *
fast_graph_launch_direct(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (door_enter("graph_launch", nargs, 2) < 0) {
        return NULL;
    }
    return PyBool_FromLong(graph_direct(args[0], args[1]));
}

PyDoc_STRVAR(configure_slots_doc, "configure_slots(Stream, Device, Graph, Kernel, Module, KernelArg) -> None\n\n"
                                  "Record where the direct path reads the __slots__ it checks on instances of "
                                  "these exact classes.");

static PyObject *
fast_configure_slots(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    static const char *const stream_names[] = {"_owned", "_closed", "_handle", "_device"};
    static const char *const device_names[] = {"_ordinal"};
    static const char *const graph_names[] = {"_exec", "_device"};
    static const char *const kernel_names[] = {"_direct", "_module", "_spec"};
    static const char *const module_names[] = {"_loaded", "_device"};
    static const char *const kernel_arg_names[] = {"_code", "_raw"};
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "configure_slots(Stream, Device, Graph, Kernel, Module, KernelArg)");
        return NULL;
    }
    if (layout_of(&stream_slots, args[0], stream_names, 4) < 0 || layout_of(&device_slots, args[1], device_names, 1) < 0 ||
        layout_of(&graph_slots, args[2], graph_names, 2) < 0 || layout_of(&kernel_slots, args[3], kernel_names, 3) < 0 ||
        layout_of(&module_slots, args[4], module_names, 2) < 0 || layout_of(&kernel_arg_slots, args[5], kernel_arg_names, 2) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(configure_streams_doc,
             "configure_streams(handles_dict, stream_handle, capturing_streams, note_capture_buffers) -> None\n\n"
             "Register what the hot methods resolve stream arguments with: cudacore._handles' module dict (its "
             "open_stream_blocks count), its stream_handle function (every case but the common ones), and "
             "cudacore._stream's set of capturing streams and the function new buffers go to while it is not "
             "empty.");

static PyObject *
fast_configure_streams(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyDict_Check(args[0]) || !PyCallable_Check(args[1]) || !PySet_Check(args[2]) ||
        !PyCallable_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "configure_streams(handles_dict: dict, stream_handle, capturing_streams: set, note)");
        return NULL;
    }
    if (str_open_blocks == NULL) {
        str_open_blocks = PyUnicode_InternFromString("open_stream_blocks");
        str_current = PyUnicode_InternFromString("_current");
        str_streams = PyUnicode_InternFromString("streams");
        if (str_open_blocks == NULL || str_current == NULL || str_streams == NULL) {
            return NULL;
        }
    }
    Py_XSETREF(handles_dict, Py_NewRef(args[0]));
    Py_XSETREF(stream_resolver, Py_NewRef(args[1]));
    Py_XSETREF(capturing_set, Py_NewRef(args[2]));
    Py_XSETREF(capture_noter, Py_NewRef(args[3]));
    Py_RETURN_NONE;
}

PyDoc_STRVAR(allocate_pinned_doc, "allocate_pinned(device: int, size: int) -> PinnedBuffer\n\n"
                                  "Allocate size bytes of page-locked host memory.");

static PyObject *
fast_allocate_pinned(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    int64_t device, size, ptr = 0;
    if (door_enter("allocate_pinned", nargs, 2) < 0 || door_int(args[0], "allocate_pinned", "device", &device) < 0 ||
        door_int(args[1], "allocate_pinned", "size", &size) < 0) {
        return NULL;
    }
    if (pinned_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cudacore._fast is not configured");
        return NULL;
    }
    PinnedObject *h = (PinnedObject *)pinned_type->tp_alloc(pinned_type, 0);
    if (h == NULL) {
        return NULL;
    }
    h->closed = 1;
    char *err;
    Py_BEGIN_ALLOW_THREADS /* cuMemHostAlloc pins pages: milliseconds for large sizes */
    err = cudacore_door_PinnedAllocate(device, size, &ptr);
    Py_END_ALLOW_THREADS
    if (err != NULL) {
        Py_DECREF(h);
        return door_raise(err);
    }
    h->ptr = (uint64_t)ptr;
    h->size = (uint64_t)size;
    h->device = device;
    h->closed = 0;
    return (PyObject *)h;
}

PyDoc_STRVAR(wrap_doc, "wrap(device: int, ptr: int, size: int, stream: int[, type]) -> Buffer\n\n"
                       "A Buffer owning an allocation already made through the device's allocator (for "
                       "example a tile of allocate_tiles), of the configured Buffer class or of type, a "
                       "subclass of it. Used by cudacore itself.");

static PyObject *
fast_wrap(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    int64_t device, size, ptr, stream;
    if (door_enter("wrap", nargs == 5 ? 4 : nargs, 4) < 0 || door_int(args[0], "wrap", "device", &device) < 0 ||
        door_int(args[1], "wrap", "ptr", &ptr) < 0 || door_int(args[2], "wrap", "size", &size) < 0 ||
        door_int(args[3], "wrap", "stream", &stream) < 0) {
        return NULL;
    }
    if (buffer_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cudacore._fast is not configured");
        return NULL;
    }
    PyTypeObject *type = buffer_type;
    if (nargs == 5) {
        if (!PyType_Check(args[4]) || !PyType_IsSubtype((PyTypeObject *)args[4], buffer_type)) {
            PyErr_SetString(PyExc_TypeError, "wrap() needs a subclass of the configured Buffer class");
            return NULL;
        }
        type = (PyTypeObject *)args[4];
    }
    BufferObject *b = (BufferObject *)type->tp_alloc(type, 0);
    if (b == NULL) {
        return NULL;
    }
    b->ptr = (uint64_t)ptr;
    b->size = (uint64_t)size;
    b->stream = (uint64_t)stream;
    b->device = device;
    b->closed = 0;
    return (PyObject *)b;
}

PyDoc_STRVAR(borrow_doc, "borrow(type, device: int, ptr: int, size: int, stream: int, owner) -> Buffer\n\n"
                         "A Buffer of the given Buffer subclass viewing memory that owner owns: it keeps owner "
                         "alive until close(), and frees nothing. Used by cudacore.interop.");

static PyObject *
fast_borrow(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    int64_t device, size, ptr, stream;
    if (door_enter("borrow", nargs, 6) < 0) {
        return NULL;
    }
    if (!PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], &BufferType)) {
        PyErr_SetString(PyExc_TypeError, "borrow() needs a subclass of Buffer");
        return NULL;
    }
    if (door_int(args[1], "borrow", "device", &device) < 0 || door_int(args[2], "borrow", "ptr", &ptr) < 0 ||
        door_int(args[3], "borrow", "size", &size) < 0 || door_int(args[4], "borrow", "stream", &stream) < 0) {
        return NULL;
    }
    if (size < 0) {
        door_invalid("borrow", "size", "must be >= 0", args[3]);
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)args[0];
    BufferObject *b = (BufferObject *)type->tp_alloc(type, 0);
    if (b == NULL) {
        return NULL;
    }
    b->ptr = (uint64_t)ptr;
    b->size = (uint64_t)size;
    b->stream = (uint64_t)stream;
    b->device = device;
    b->borrowed = 1;
    b->owner = Py_NewRef(args[5]);
    b->closed = 0;
    return (PyObject *)b;
}

PyDoc_STRVAR(call_doc, "call(fn, *args)\n\n"
                       "The cold door: call one of gopy's generated functions after the fork check, and turn "
                       "the RuntimeError it raises for a Go error into the typed exception (the original is "
                       "its __cause__).");

/* The name of fn's parameter i as Python users spell it (gopy keeps the Go names: tileSize becomes
 * tile_size), or "argument <i+1>" when fn has no code object. Only used on an error path. */
static void
param_name(PyObject *fn, Py_ssize_t i, char *out, size_t n)
{
    snprintf(out, n, "argument %zd", i + 1);
    PyObject *code = PyObject_GetAttrString(fn, "__code__");
    if (code == NULL) {
        /* gopy's C function itself (see cudacore._native): its Python wrapper knows the names. */
        PyErr_Clear();
        PyObject *native = PyImport_ImportModule("cudacore._native");
        PyObject *wrappers = native != NULL ? PyObject_GetAttrString(native, "gopy_wrappers") : NULL;
        PyObject *name = PyObject_GetAttrString(fn, "__name__");
        PyObject *wrapper = wrappers != NULL && name != NULL && PyDict_Check(wrappers) ? PyDict_GetItem(wrappers, name) : NULL;
        code = wrapper != NULL ? PyObject_GetAttrString(wrapper, "__code__") : NULL;
        Py_XDECREF(name);
        Py_XDECREF(wrappers);
        Py_XDECREF(native);
    }
    PyObject *names = code != NULL ? PyObject_GetAttrString(code, "co_varnames") : NULL;
    PyErr_Clear();
    if (names != NULL && PyTuple_Check(names) && i < PyTuple_GET_SIZE(names)) {
        const char *go = PyUnicode_AsUTF8(PyTuple_GET_ITEM(names, i));
        if (go != NULL) {
            size_t k = 0;
            for (const char *c = go; *c != '\0' && k + 2 < n; c++) {
                if (*c >= 'A' && *c <= 'Z') {
                    if (k > 0) {
                        out[k++] = '_';
                    }
                    out[k++] = (char)(*c - 'A' + 'a');
                } else {
                    out[k++] = *c;
                }
            }
            out[k] = '\0';
        }
        PyErr_Clear();
    }
    Py_XDECREF(names);
    Py_XDECREF(code);
}

static PyObject *
fast_call(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "call() needs the function to call");
        return NULL;
    }
    if (cudacore_forked) {
        PyObject *name = PyObject_GetAttrString(args[0], "__name__");
        const char *fn = name != NULL && PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
        PyErr_Clear();
        if (fn != NULL && strncmp(fn, "cudacore_", 9) == 0) {
            fn += 9;
        }
        door_check_fork(fn != NULL ? fn : "call");
        Py_XDECREF(name);
        return NULL;
    }
    /* A cold wrapper (cold_gen.c) checks its own arguments, naming them, after the fork check, and raises
     * the typed exception itself: straight in. */
    if (PyCFunction_Check(args[0]) && (PyCFunction_GET_FLAGS(args[0]) & METH_FASTCALL) != 0) {
        return PyObject_Vectorcall(args[0], args + 1, (size_t)(nargs - 1), NULL);
    }
    /* gopy's wrappers take Go ints as C long long: a Python int beyond int64 would be a bare OverflowError
     * naming nothing. Refuse it here, naming the function and the argument's position. */
    for (Py_ssize_t i = 1; i < nargs; i++) {
        if (PyLong_Check(args[i]) && !PyBool_Check(args[i])) {
            int overflow = 0;
            (void)PyLong_AsLongLongAndOverflow(args[i], &overflow);
            if (overflow != 0) {
                PyObject *name = PyObject_GetAttrString(args[0], "__name__");
                const char *fn = name != NULL && PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
                if (fn != NULL && strncmp(fn, "cudacore_", 9) == 0) {
                    fn += 9; /* gopy's C function: cudacore_<Name> */
                }
                PyErr_Clear();
                char arg[64];
                param_name(args[0], i - 1, arg, sizeof arg);
                door_invalid(fn != NULL ? fn : "call", arg, "must be an integer in [-2**63, 2**63)", args[i]);
                Py_XDECREF(name);
                return NULL;
            }
        }
    }
    PyObject *r = PyObject_Vectorcall(args[0], args + 1, (size_t)(nargs - 1), NULL);
    if (r != NULL || !PyErr_ExceptionMatches(PyExc_RuntimeError)) {
        return r;
    }
    return door_translate();
}

PyDoc_STRVAR(launch_doc, "launch(function: int, gx, gy, gz, bx, by, bz, shared_mem, stream, args, spec) -> int\n\n"
                         "Kernel.launch's hot path: pack args by spec (3 bytes a parameter: kind code, size, "
                         "flags 1=float 2=takes a Buffer) and launch through the FunctionLaunch door, returning what "
                         "it returns. Python numbers, numpy scalars, typed values (cudacore.int32(...)) and Buffers pack in C; "
                         "returns NotImplemented, having done nothing, when an argument needs the general path (bytes, "
                         "an object with __cuda_array_interface__, a value out of range, a wrong count).");

enum { LAUNCH_FLOAT = 1, LAUNCH_BUFFER = 2, LAUNCH_PTR_CODE = 12, LAUNCH_MAX_PACKED = 1024 };


/* A number read from a numpy scalar (or a 0-d numpy array). */
typedef struct {
    enum { NUM_SIGNED, NUM_UNSIGNED, NUM_FLOAT } kind;
    long long i;
    unsigned long long u;
    double f;
} number;

/* Read a as a numpy number: numpy's own scalar types (and 0-d arrays) are static C types named
 * "numpy.*", whose buffer export is numpy's C code, so reading one runs no Python code (the direct path
 * holds the GIL from its checks to the driver's call). 1 read, 0 not one (no exception set). */
static int
numpy_number(PyObject *a, number *n)
{
    PyTypeObject *t = Py_TYPE(a);
    if ((t->tp_flags & Py_TPFLAGS_HEAPTYPE) != 0 || strncmp(t->tp_name, "numpy.", 6) != 0 || !PyObject_CheckBuffer(a)) {
        return 0;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(a, &view, PyBUF_ND | PyBUF_FORMAT) < 0) { /* ND: the true ndim (else 0) */
        PyErr_Clear();
        return 0;
    }
    int ok = 0;
    const char *f = view.format;
    if (view.ndim == 0 && f != NULL) {
        if (*f == '@' || *f == '=' || *f == '<') { /* native order on the little-endian hosts cudacore runs on */
            f++;
        }
        if (f[0] != '\0' && f[1] == '\0') {
            ok = 1;
            switch (f[0]) {
            case 'b': n->kind = NUM_SIGNED, n->i = *(const signed char *)view.buf; break;
            case 'h': n->kind = NUM_SIGNED, n->i = *(const short *)view.buf; break;
            case 'i': n->kind = NUM_SIGNED, n->i = *(const int *)view.buf; break;
            case 'l': n->kind = NUM_SIGNED, n->i = *(const long *)view.buf; break;
            case 'q': n->kind = NUM_SIGNED, n->i = *(const long long *)view.buf; break;
            case 'B': n->kind = NUM_UNSIGNED, n->u = *(const unsigned char *)view.buf; break;
            case 'H': n->kind = NUM_UNSIGNED, n->u = *(const unsigned short *)view.buf; break;
            case 'I': n->kind = NUM_UNSIGNED, n->u = *(const unsigned int *)view.buf; break;
            case 'L': n->kind = NUM_UNSIGNED, n->u = *(const unsigned long *)view.buf; break;
            case 'Q': n->kind = NUM_UNSIGNED, n->u = *(const unsigned long long *)view.buf; break;
            case 'f': n->kind = NUM_FLOAT, n->f = *(const float *)view.buf; break;
            case 'd': n->kind = NUM_FLOAT, n->f = *(const double *)view.buf; break;
            default: ok = 0; /* bool, half, complex, ...: the general path decides */
            }
        }
    }
    PyBuffer_Release(&view);
    return ok;
}

/* Write an integer into a parameter of kind code and size bytes, when it fits: 1, or 0 (nothing
 * written). negative says the value is v as a signed number (else as an unsigned one). */
static int
pack_int(int code, int size, int negative, unsigned long long v, unsigned char *out)
{
    int signed_kind = code == 1 || code == 3 || code == 5 || code == 7; /* i8 i16 i32 i64 */
    if (signed_kind) {
        unsigned long long bound = 1ULL << (size * 8 - 1); /* |min|; max is bound - 1 */
        if (negative ? (0 - v) > bound : v >= bound) {
            return 0;
        }
    } else if (negative || (size < 8 && v >> (size * 8) != 0)) {
        return 0;
    }
    memcpy(out, &v, (size_t)size); /* little-endian: the low bytes, two's complement for a negative value */
    return 1;
}

/* Pack one argument; 1 packed, 0 needs the general path, -1 error set. */
static int
launch_pack_one(PyObject *a, int code, int size, int flags, unsigned char *out)
{
    number n;
    PyObject *kcode = slot_of(&kernel_arg_slots, a, 0);
    if (kcode != NULL) {
        /* A typed value (cudacore.int32(...)): checked and encoded when it was made; passed as it is, as the
         * general path passes it, where its size is the parameter's. */
        PyObject *raw = slot_of(&kernel_arg_slots, a, 1);
        int64_t c = int_of(kcode);
        if (raw == NULL || !PyBytes_CheckExact(raw) || PyBytes_GET_SIZE(raw) != size || c < 1 || c >= LAUNCH_PTR_CODE + 1) {
            return 0;
        }
        memcpy(out, PyBytes_AS_STRING(raw), (size_t)size);
        out[-3] = (unsigned char)c;
        return 1;
    }
    if (flags & LAUNCH_FLOAT) {
        double v;
        if (PyFloat_CheckExact(a)) {
            v = PyFloat_AS_DOUBLE(a);
        } else if (PyLong_CheckExact(a)) {
            v = PyLong_AsDouble(a);
            if (v == -1.0 && PyErr_Occurred()) {
                PyErr_Clear();
                return 0;
            }
        } else if (numpy_number(a, &n)) {
            v = n.kind == NUM_FLOAT ? n.f : n.kind == NUM_SIGNED ? (double)n.i : (double)n.u;
        } else {
            return 0;
        }
        if (size == 4) {
            if (isfinite(v) && (v > FLT_MAX || v < -FLT_MAX)) {
                return 0; /* does not fit a float: the general path explains */
            }
            float f = (float)v;
            memcpy(out, &f, 4);
        } else if (size == 8) {
            memcpy(out, &v, 8);
        } else {
            return 0; /* half precision: the general path converts it */
        }
        return 1;
    }
    if (PyLong_CheckExact(a)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(a, &overflow);
        if (overflow == 0 && !(v == -1 && PyErr_Occurred())) {
            return pack_int(code, size, v < 0, (unsigned long long)v, out);
        }
        PyErr_Clear();
        if (overflow > 0) { /* above int64: an unsigned 64-bit value, or out of range */
            unsigned long long u = PyLong_AsUnsignedLongLong(a);
            if (u == (unsigned long long)-1 && PyErr_Occurred()) {
                PyErr_Clear();
                return 0;
            }
            return pack_int(code, size, 0, u, out);
        }
        return 0;
    }
    if (numpy_number(a, &n)) {
        if (n.kind == NUM_FLOAT) {
            return 0; /* a float for an integer parameter: the general path refuses it */
        }
        return n.kind == NUM_SIGNED ? pack_int(code, size, n.i < 0, (unsigned long long)n.i, out)
                                    : pack_int(code, size, 0, n.u, out);
    }
    if ((flags & LAUNCH_BUFFER) && PyObject_TypeCheck(a, &BufferType)) {
        BufferObject *b = (BufferObject *)a;
        if (size != 8) {
            return 0;
        }
        if (b->closed || b->freeing) {
            door_closed("Buffer", "cudacore.launch");
            return -1;
        }
        memcpy(out, &b->ptr, 8);
        out[-3] = LAUNCH_PTR_CODE;
        return 1;
    }
    return 0;
}

/* args with each array of another library passed for a pointer parameter (an object with
 * __cuda_array_interface__: a CuPy array, a Numba device array, a PyTorch tensor) replaced by its device
 * address, as the general path reads it (the "data" entry's address): a new reference, to args itself when
 * nothing was replaced. Reading the attribute can run Python code (a property), so callers resolve the
 * arguments before any check the direct path relies on. An object whose interface cannot be read is left
 * as it is, for the general path to explain. NULL only when Python is out of memory. */
static PyObject *
resolve_array_args(PyObject *args, PyObject *spec)
{
    if ((!PyTuple_CheckExact(args) && !PyList_CheckExact(args)) || !PyBytes_CheckExact(spec) ||
        PySequence_Fast_GET_SIZE(args) * 3 != PyBytes_GET_SIZE(spec)) {
        return Py_NewRef(args);
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(args);
    const unsigned char *sp = (const unsigned char *)PyBytes_AS_STRING(spec);
    PyObject **items = PySequence_Fast_ITEMS(args);
    PyObject *out = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = items[i];
        if (!(sp[3 * i + 2] & LAUNCH_BUFFER) || PyLong_CheckExact(a) || PyObject_TypeCheck(a, &BufferType) ||
            slot_of(&kernel_arg_slots, a, 0) != NULL || PyObject_CheckBuffer(a)) {
            continue; /* packed as it is, or left to the general path */
        }
        PyObject *cai = PyObject_GetAttrString(a, "__cuda_array_interface__");
        PyObject *data = cai != NULL && PyDict_Check(cai) ? PyDict_GetItemString(cai, "data") : NULL; /* borrowed */
        PyObject *ptr = data != NULL && PyTuple_Check(data) && PyTuple_GET_SIZE(data) >= 1 ? PyTuple_GET_ITEM(data, 0) : NULL;
        if (ptr == NULL || !PyLong_CheckExact(ptr)) {
            PyErr_Clear();
            Py_XDECREF(cai);
            continue;
        }
        if (out == NULL && (out = PyList_New(n)) != NULL) {
            for (Py_ssize_t j = 0; j < n; j++) {
                PyList_SET_ITEM(out, j, Py_NewRef(items[j]));
            }
        }
        if (out == NULL) {
            Py_DECREF(cai);
            return NULL;
        }
        Py_SETREF(PyList_GET_ITEM(out, i), Py_NewRef(ptr));
        Py_DECREF(cai);
    }
    return out != NULL ? out : Py_NewRef(args);
}

/* Pack seq by spec into packed (the FunctionLaunch door's format: per argument its kind code, size and a
 * zero byte, then the value). 1 packed (*len set), 0 needs the general path, -1 error set. */
static int
launch_pack(PyObject *seq, PyObject *spec, unsigned char *packed, size_t *len)
{
    if ((!PyTuple_CheckExact(seq) && !PyList_CheckExact(seq)) || !PyBytes_CheckExact(spec)) {
        return 0;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    const unsigned char *sp = (const unsigned char *)PyBytes_AS_STRING(spec);
    if (n * 3 != PyBytes_GET_SIZE(spec) || n * 11 > LAUNCH_MAX_PACKED) {
        return 0;
    }
    size_t off = 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        int code = sp[3 * i], size = sp[3 * i + 1], flags = sp[3 * i + 2];
        if ((size != 1 && size != 2 && size != 4 && size != 8) || code < 1 || code > LAUNCH_PTR_CODE) {
            return 0; /* not a spec Kernel made: the general path decides */
        }
        packed[off] = (unsigned char)code;
        packed[off + 1] = (unsigned char)size;
        packed[off + 2] = 0;
        int r = launch_pack_one(items[i], code, size, flags, packed + off + 3);
        if (r <= 0) {
            return r;
        }
        off += 3 + (size_t)size;
    }
    *len = off;
    return 1;
}

static PyObject *
fast_launch(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    int64_t v[9];
    static const char *names[9] = {"function", "gx", "gy", "gz", "bx", "by", "bz", "shared_mem", "stream"};
    if (door_enter("launch", nargs, 11) < 0) {
        return NULL;
    }
    for (int i = 0; i < 9; i++) {
        if (door_int(args[i], "launch", names[i], &v[i]) < 0) {
            return NULL;
        }
    }
    PyObject *resolved = resolve_array_args(args[9], args[10]);
    if (resolved == NULL) {
        return NULL;
    }
    unsigned char packed[LAUNCH_MAX_PACKED];
    size_t off = 0;
    int r = launch_pack(resolved, args[10], packed, &off);
    Py_DECREF(resolved);
    if (r < 0) {
        return NULL;
    }
    if (r == 0) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    int64_t ret;
    char *err = cudacore_door_FunctionLaunch(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], packed,
                                             (int64_t)off, &ret);
    if (err != NULL) {
        return door_raise(err);
    }
    return PyLong_FromLongLong(ret);
}

PyDoc_STRVAR(launch_direct_doc,
             "launch_direct(kernel, gx, gy, gz, bx, by, bz, shared_mem, stream, args) -> bool\n\n"
             "Kernel.launch on the direct path: pack args by kernel._spec as launch() does and launch "
             "kernel._direct, the driver's function handle that FunctionLaunch handed out, on stream from C. "
             "The checks (the module loaded, direct_stream) and the driver call happen with the GIL held "
             "throughout. False when not taken (an argument needs the general path, no direct path, or the "
             "driver failed): the caller launches through Go, which checks and reports.");

static int kernel_direct_resolved(PyObject *kernel, const int64_t v[7], int64_t fn, PyObject *mod, PyObject *spec,
                                  int64_t device, PyObject *cur, PyObject *resolved);

/* Kernel.launch on the direct path: v holds gx, gy, gz, bx, by, bz and shared_mem. 1 launched, 0 not
 * taken (nothing done: the full path decides and explains), -1 error set. */
static int
kernel_direct(PyObject *kernel, const int64_t v[7], PyObject *stream, PyObject *args)
{
    for (int i = 0; i < 6; i++) {
        if (v[i] < 1 || v[i] > UINT32_MAX) {
            return 0;
        }
    }
    if (v[6] < 0 || v[6] > UINT32_MAX || cudacore_forked) {
        return 0;
    }
    int64_t fn = int_of(slot_of(&kernel_slots, kernel, 0));
    PyObject *mod = slot_of(&kernel_slots, kernel, 1);
    PyObject *spec = slot_of(&kernel_slots, kernel, 2);
    if (fn <= 0 || mod == NULL || spec == NULL || slot_of(&module_slots, mod, 0) != Py_True) {
        return 0;
    }
    int64_t device = ordinal_in(&module_slots, mod, 1);
    if (device < 0) {
        return 0;
    }
    /* Python code may run while the arguments and the current stream are resolved; none runs after. The
     * module and the spec are held meanwhile (the slots that lent them could change). */
    Py_INCREF(mod);
    Py_INCREF(spec);
    PyObject *resolved = resolve_array_args(args, spec);
    PyObject *cur = resolved == NULL ? NULL : stream == NULL || stream == Py_None ? current_for_direct(device) : Py_NewRef(stream);
    int r = kernel_direct_resolved(kernel, v, fn, mod, spec, device, cur, resolved);
    Py_XDECREF(cur);
    Py_XDECREF(resolved);
    Py_DECREF(spec);
    Py_DECREF(mod);
    return resolved == NULL ? -1 : r;
}

/* kernel_direct past the resolution of its arguments (resolved) and of its stream (cur; NULL: not on the
 * direct path). No Python code runs here until the driver has the launch. */
static int
kernel_direct_resolved(PyObject *kernel, const int64_t v[7], int64_t fn, PyObject *mod, PyObject *spec,
                       int64_t device, PyObject *cur, PyObject *resolved)
{
    if (cur == NULL || resolved == NULL) {
        return 0;
    }
    /* From here to the driver's call no Python code runs: the checks hold until the launch. The module, the
     * kernel's slots and the stream are read again after the resolution above. */
    uint64_t handle = int_of(slot_of(&kernel_slots, kernel, 0)) == fn && slot_of(&module_slots, mod, 0) == Py_True &&
                              no_pending_graph_memory()
                          ? direct_stream(cur, device)
                          : 0;
    if (handle == 0) {
        return 0;
    }
    unsigned char packed[LAUNCH_MAX_PACKED];
    size_t len = 0;
    int r = launch_pack(resolved, spec, packed, &len); /* runs no Python code: numbers, numpy scalars, typed values, Buffers */
    if (r <= 0) {
        return r;
    }
    /* The driver reads each parameter through a pointer: each value gets an aligned slot of its own. */
    uint64_t slots[LAUNCH_MAX_PACKED / 4];
    void *params[LAUNCH_MAX_PACKED / 4];
    size_t n = 0;
    for (size_t off = 0; off < len; n++) {
        size_t size = packed[off + 1];
        slots[n] = 0;
        memcpy(&slots[n], packed + off + 3, size);
        params[n] = &slots[n];
        off += 3 + size;
    }
    const unsigned int grid[3] = {(unsigned int)v[0], (unsigned int)v[1], (unsigned int)v[2]};
    const unsigned int block[3] = {(unsigned int)v[3], (unsigned int)v[4], (unsigned int)v[5]};
    return direct_launch(device, (uint64_t)fn, grid, block, (unsigned int)v[6], handle, params);
}

static PyObject *
fast_launch_direct(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    int64_t v[7];
    static const char *names[7] = {"gx", "gy", "gz", "bx", "by", "bz", "shared_mem"};
    if (door_enter("launch", nargs, 10) < 0) {
        return NULL;
    }
    for (int i = 0; i < 7; i++) {
        if (door_int(args[i + 1], "launch", names[i], &v[i]) < 0) {
            return NULL;
        }
    }
    int r = kernel_direct(args[0], v, args[8], args[9]);
    return r < 0 ? NULL : PyBool_FromLong(r);
}

/* ---------------------------------------------------------------------------------------------------- */
/* Hot methods of the Python classes                                                                     */
/*
 * Stream.synchronize and query, Event.synchronize and query, Graph.launch and Kernel.launch are the inner
 * calls of copy, replay and launch loops, where a Python frame costs a noticeable share of the call. install_methods() replaces
 * each of them on its class with a method descriptor of a C function here. That function makes the call on
 * the direct path when it may (the same conditions as every direct call: direct.h), and otherwise calls the
 * Python function it replaced, so every check, error and wait beyond the direct case stays the Python
 * layer's. The Python definitions stay in the source: they are what readers, type checkers and help() see,
 * and what runs whenever C does not take the call.
 */

/* How long a direct wait queries with the GIL held before it hands the wait to the Python method, which
 * waits in GIL-released, interruptible slices through Go. Most synchronizes follow copies and launches of
 * a few microseconds to a few tens; a wait this short delays other threads no more than any GIL-held driver
 * call does, and querying from C reacts within one query of the work's end. */
#define DIRECT_SPIN_NS 20000

static slot_layout event_slots; /* _handle, _device */

/* The handle of an Event of the exact class that the direct path may query, with its device's ordinal in
 * *device; 0 when the query must go through Go. Event.close() clears _handle, with the GIL held, before it
 * destroys the event. Never sets an exception. */
static uint64_t
direct_event(PyObject *event, int64_t *device)
{
    if (capturing_set == NULL || PySet_GET_SIZE(capturing_set) != 0 || cudacore_forked) {
        return 0;
    }
    *device = ordinal_in(&event_slots, event, 1);
    int64_t handle = int_of(slot_of(&event_slots, event, 0));
    return handle > 0 && *device >= 0 && direct_enabled(*device) ? (uint64_t)handle : 0;
}

/* The handle of a Stream the direct path may query or wait on (direct_stream), with its device's ordinal
 * in *device; 0 when not. */
static uint64_t
direct_own_stream(PyObject *stream, int64_t *device)
{
    *device = ordinal_in(&stream_slots, stream, S_DEVICE);
    return *device >= 0 && !cudacore_forked ? direct_stream(stream, *device) : 0;
}

static int64_t
monotonic_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Query until the work is done, for at most DIRECT_SPIN_NS: 1 done, 0 still running, -1 not taken. */
static int
direct_spin(int (*query)(int64_t, uint64_t), int64_t device, uint64_t handle)
{
    int64_t start = 0;
    for (;;) {
        int r = query(device, handle);
        if (r != 0) {
            return r;
        }
        int64_t now = monotonic_ns();
        if (start == 0) {
            start = now;
        } else if (now - start >= DIRECT_SPIN_NS) {
            return 0;
        }
    }
}

/* The arguments of a hot method, by position or keyword, into out[0..n) (borrowed; NULL where not given):
 * 0, or -1 when they do not fit names (the Python method then says what is wrong). */
static int
hot_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const char *const *names, int n, PyObject **out)
{
    if (nargs > n) {
        return -1;
    }
    for (int i = 0; i < n; i++) {
        out[i] = i < nargs ? args[i] : NULL;
    }
    Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        /* With its length: a keyword with an embedded NUL ("stream\0x") is no parameter's name. */
        Py_ssize_t len = 0;
        const char *key = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(kwnames, k), &len);
        int i = 0;
        while (i < n && (key == NULL || (size_t)len != strlen(names[i]) || memcmp(key, names[i], (size_t)len) != 0)) {
            i++;
        }
        if (i == n || out[i] != NULL) {
            PyErr_Clear();
            return -1;
        }
        out[i] = args[nargs + k];
    }
    return 0;
}

/* The hot halves. Each returns its result, or NULL with an exception, or NULL without one: not taken (the
 * Python method runs instead, with the same arguments). */
static PyObject *
hot_stream_synchronize(PyObject *self, PyObject *const *Py_UNUSED(args), Py_ssize_t nargs, PyObject *kwnames)
{
    int64_t device;
    uint64_t h = nargs == 0 && kwnames == NULL ? direct_own_stream(self, &device) : 0;
    if (h != 0 && direct_spin(direct_stream_query, device, h) == 1) {
        Py_RETURN_NONE;
    }
    return NULL;
}

static PyObject *
hot_stream_query(PyObject *self, PyObject *const *Py_UNUSED(args), Py_ssize_t nargs, PyObject *kwnames)
{
    int64_t device;
    uint64_t h = nargs == 0 && kwnames == NULL ? direct_own_stream(self, &device) : 0;
    int r = h != 0 ? direct_stream_query(device, h) : -1;
    return r < 0 ? NULL : PyBool_FromLong(r);
}

static PyObject *
hot_event_synchronize(PyObject *self, PyObject *const *Py_UNUSED(args), Py_ssize_t nargs, PyObject *kwnames)
{
    int64_t device;
    uint64_t h = nargs == 0 && kwnames == NULL ? direct_event(self, &device) : 0;
    if (h != 0 && direct_spin(direct_event_query, device, h) == 1) {
        Py_RETURN_NONE;
    }
    return NULL;
}

static PyObject *
hot_event_query(PyObject *self, PyObject *const *Py_UNUSED(args), Py_ssize_t nargs, PyObject *kwnames)
{
    int64_t device;
    uint64_t h = nargs == 0 && kwnames == NULL ? direct_event(self, &device) : 0;
    int r = h != 0 ? direct_event_query(device, h) : -1;
    return r < 0 ? NULL : PyBool_FromLong(r);
}

static PyObject *
hot_graph_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"stream"};
    PyObject *stream;
    if (hot_args(args, nargs, kwnames, names, 1, &stream) == 0 && graph_direct(self, stream)) {
        Py_RETURN_NONE;
    }
    return NULL;
}

/* launch(grid, block, args, shared_mem, stream) with an int grid and block, an int shared_mem and a Stream. */
static PyObject *
hot_kernel_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"grid", "block", "args", "shared_mem", "stream"};
    PyObject *a[5];
    if (hot_args(args, nargs, kwnames, names, 5, a) < 0 || a[0] == NULL || a[1] == NULL || a[2] == NULL) {
        return NULL;
    }
    int64_t grid = int_of(a[0]), block = int_of(a[1]), shared = a[3] == NULL ? 0 : int_of(a[3]);
    if (grid < 1 || block < 1 || shared < 0) {
        return NULL;
    }
    const int64_t v[7] = {grid, 1, 1, block, 1, 1, shared};
    int r = kernel_direct(self, v, a[4], a[2]);
    return r < 0 ? NULL : r == 1 ? Py_NewRef(Py_None) : NULL;
}

typedef struct {
    int cls;             /* which class of install_methods' arguments: 0 Stream, 1 Event, 2 Graph, 3 Kernel */
    const char *name;    /* the method's name on it */
    const char *sig;     /* its text signature, for inspect.signature and help() */
    PyObject *(*hot)(PyObject *, PyObject *const *, Py_ssize_t, PyObject *);
    PyObject *fallback;  /* the Python function it replaced; set by install_methods */
} hot_method;

enum {
    HOT_STREAM_SYNCHRONIZE,
    HOT_STREAM_QUERY,
    HOT_EVENT_SYNCHRONIZE,
    HOT_EVENT_QUERY,
    HOT_GRAPH_LAUNCH,
    HOT_KERNEL_LAUNCH,
    HOT_N
};

static hot_method hot_methods[HOT_N] = {
    [HOT_STREAM_SYNCHRONIZE] = {0, "synchronize", "($self, /)", hot_stream_synchronize, NULL},
    [HOT_STREAM_QUERY] = {0, "query", "($self, /)", hot_stream_query, NULL},
    [HOT_EVENT_SYNCHRONIZE] = {1, "synchronize", "($self, /)", hot_event_synchronize, NULL},
    [HOT_EVENT_QUERY] = {1, "query", "($self, /)", hot_event_query, NULL},
    [HOT_GRAPH_LAUNCH] = {2, "launch", "($self, /, stream=None)", hot_graph_launch, NULL},
    [HOT_KERNEL_LAUNCH] = {3, "launch", "($self, /, grid=1, block=1, args=(), shared_mem=0, stream=None)",
                           hot_kernel_launch, NULL},
};

/* Call method i: its hot half, then, if that did not take the call, the Python function with self and the
 * arguments as given. */
static PyObject *
hot_dispatch(int i, PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *r = hot_methods[i].hot(self, args, nargs, kwnames);
    if (r != NULL || PyErr_Occurred()) {
        return r;
    }
    Py_ssize_t total = nargs + (kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *small[8];
    PyObject **stack = total < 8 ? small : PyMem_Malloc((size_t)(total + 1) * sizeof(PyObject *));
    if (stack == NULL) {
        return PyErr_NoMemory();
    }
    stack[0] = self;
    memcpy(stack + 1, args, (size_t)total * sizeof(PyObject *));
    r = PyObject_Vectorcall(hot_methods[i].fallback, stack, (size_t)(nargs + 1), kwnames);
    if (stack != small) {
        PyMem_Free(stack);
    }
    return r;
}

#define HOT_ENTRY(I, NAME)                                                                                     \
    static PyObject *NAME(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)        \
    {                                                                                                          \
        return hot_dispatch(I, self, args, nargs, kwnames);                                                    \
    }
HOT_ENTRY(HOT_STREAM_SYNCHRONIZE, entry_stream_synchronize)
HOT_ENTRY(HOT_STREAM_QUERY, entry_stream_query)
HOT_ENTRY(HOT_EVENT_SYNCHRONIZE, entry_event_synchronize)
HOT_ENTRY(HOT_EVENT_QUERY, entry_event_query)
HOT_ENTRY(HOT_GRAPH_LAUNCH, entry_graph_launch)
HOT_ENTRY(HOT_KERNEL_LAUNCH, entry_kernel_launch)
#undef HOT_ENTRY

static PyCFunctionWithKeywords hot_entries[HOT_N] = {
    [HOT_STREAM_SYNCHRONIZE] = (PyCFunctionWithKeywords)(void (*)(void))entry_stream_synchronize,
    [HOT_STREAM_QUERY] = (PyCFunctionWithKeywords)(void (*)(void))entry_stream_query,
    [HOT_EVENT_SYNCHRONIZE] = (PyCFunctionWithKeywords)(void (*)(void))entry_event_synchronize,
    [HOT_EVENT_QUERY] = (PyCFunctionWithKeywords)(void (*)(void))entry_event_query,
    [HOT_GRAPH_LAUNCH] = (PyCFunctionWithKeywords)(void (*)(void))entry_graph_launch,
    [HOT_KERNEL_LAUNCH] = (PyCFunctionWithKeywords)(void (*)(void))entry_kernel_launch,
};

PyDoc_STRVAR(install_methods_doc,
             "install_methods(Stream, Event, Graph, Kernel) -> None\n\n"
             "Replace Stream.synchronize and query, Event.synchronize and query, Graph.launch and Kernel.launch with method "
             "descriptors that make the call on the direct path when they may and call the replaced Python "
             "method otherwise. Once per process: a second call changes nothing.");

static PyObject *
fast_install_methods(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    static const char *const event_names[] = {"_handle", "_device"};
    if (nargs != 4 || !PyType_Check(args[0]) || !PyType_Check(args[1]) || !PyType_Check(args[2]) ||
        !PyType_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "install_methods(Stream, Event, Graph, Kernel)");
        return NULL;
    }
    if (hot_methods[0].fallback != NULL) {
        Py_RETURN_NONE;
    }
    if (layout_of(&event_slots, args[1], event_names, 2) < 0) {
        return NULL;
    }
    /* Check everything before changing anything: each name must be a plain Python function of its class. */
    PyObject *fns[HOT_N];
    for (int i = 0; i < HOT_N; i++) {
        PyObject *dict = ((PyTypeObject *)args[hot_methods[i].cls])->tp_dict;
        fns[i] = PyDict_GetItemString(dict, hot_methods[i].name); /* borrowed */
        if (fns[i] == NULL || !PyFunction_Check(fns[i])) {
            PyErr_Format(PyExc_TypeError, "install_methods: %s.%s is not a Python function",
                         ((PyTypeObject *)args[hot_methods[i].cls])->tp_name, hot_methods[i].name);
            return NULL;
        }
    }
    for (int i = 0; i < HOT_N; i++) {
        /* The descriptor keeps its PyMethodDef for good: made once per process, never freed. */
        PyObject *doc = PyObject_GetAttrString(fns[i], "__doc__");
        const char *text = doc != NULL && PyUnicode_Check(doc) ? PyUnicode_AsUTF8(doc) : "";
        PyErr_Clear();
        size_t n = strlen(hot_methods[i].name) + strlen(hot_methods[i].sig) + strlen(text != NULL ? text : "") + 8;
        char *ml_doc = PyMem_RawMalloc(n);
        PyMethodDef *def = PyMem_RawCalloc(1, sizeof *def);
        if (ml_doc == NULL || def == NULL) {
            Py_XDECREF(doc);
            PyMem_RawFree(ml_doc);
            PyMem_RawFree(def);
            return PyErr_NoMemory();
        }
        snprintf(ml_doc, n, "%s%s\n--\n\n%s", hot_methods[i].name, hot_methods[i].sig, text != NULL ? text : "");
        Py_XDECREF(doc);
        def->ml_name = hot_methods[i].name;
        def->ml_meth = (PyCFunction)(void (*)(void))hot_entries[i];
        def->ml_flags = METH_FASTCALL | METH_KEYWORDS;
        def->ml_doc = ml_doc;
        PyObject *cls = args[hot_methods[i].cls];
        PyObject *descr = PyDescr_NewMethod((PyTypeObject *)cls, def);
        if (descr == NULL) {
            return NULL;
        }
        hot_methods[i].fallback = Py_NewRef(fns[i]);
        int rc = PyObject_SetAttrString(cls, hot_methods[i].name, descr);
        Py_DECREF(descr);
        if (rc < 0) {
            return NULL;
        }
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(configure_doc, "configure(buffer_type, pinned_type, funnel, stream_type, held_max) -> None\n\n"
                            "Register the Python subclasses to instantiate, the error funnel (the "
                            "cudacore._errors module), the Stream class and the largest copy that keeps the GIL.");

static PyObject *
fast_configure(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "configure() takes exactly 5 arguments");
        return NULL;
    }
    if (!PyType_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "configure() needs the Stream class");
        return NULL;
    }
    Py_ssize_t hm = PyLong_AsSsize_t(args[4]);
    if (hm == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (!PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], &BufferType) ||
        !PyType_Check(args[1]) || !PyType_IsSubtype((PyTypeObject *)args[1], &PinnedType)) {
        PyErr_SetString(PyExc_TypeError, "configure() needs subclasses of Buffer and PinnedBuffer");
        return NULL;
    }
    if (door_configure(args[2]) < 0) {
        return NULL;
    }
    Py_XSETREF(buffer_type, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(pinned_type, (PyTypeObject *)Py_NewRef(args[1]));
    Py_XSETREF(stream_type, (PyTypeObject *)Py_NewRef(args[3]));
    held_max = hm;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(configure_device_doc, "configure_device(device: int, blocking: bool) -> None\n\n"
                                   "Whether the device's allocator can block (the synchronous strategy), so "
                                   "that its calls release the GIL.");

static PyObject *
fast_configure_device(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    int64_t device;
    int flag;
    if (door_enter("configure_device", nargs, 2) < 0 || door_int(args[0], "configure_device", "device", &device) < 0 ||
        door_bool(args[1], "configure_device", "blocking", &flag) < 0) {
        return NULL;
    }
    door_set_blocking(device, flag);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(forked_doc, "forked() -> bool\n\nWhether this process is a fork child of one that had loaded cudacore.");

static PyObject *
fast_forked(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(cudacore_forked);
}

PyDoc_STRVAR(fork_driver_doc, "fork_driver() -> int\n\nThe parent's CUDA driver at the last fork: 0 not loaded, "
                              "1 loaded, 2 initialised (by any library).");

static PyObject *
fast_fork_driver(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLong(cudacore_fork_driver);
}

static PyMethodDef fast_methods[] = {
    {"allocate", (PyCFunction)(void (*)(void))fast_allocate, METH_FASTCALL, allocate_doc},
    {"device_allocate", (PyCFunction)(void (*)(void))fast_device_allocate, METH_FASTCALL, device_allocate_doc},
    {"configure_direct", (PyCFunction)(void (*)(void))fast_configure_direct, METH_FASTCALL, configure_direct_doc},
    {"graph_launch_direct", (PyCFunction)(void (*)(void))fast_graph_launch_direct, METH_FASTCALL,
     graph_launch_direct_doc},
    {"configure_slots", (PyCFunction)(void (*)(void))fast_configure_slots, METH_FASTCALL, configure_slots_doc},
    {"install_methods", (PyCFunction)(void (*)(void))fast_install_methods, METH_FASTCALL, install_methods_doc},
    {"configure_streams", (PyCFunction)(void (*)(void))fast_configure_streams, METH_FASTCALL,
     configure_streams_doc},
    {"allocate_pinned", (PyCFunction)(void (*)(void))fast_allocate_pinned, METH_FASTCALL, allocate_pinned_doc},
    {"wrap", (PyCFunction)(void (*)(void))fast_wrap, METH_FASTCALL, wrap_doc},
    {"borrow", (PyCFunction)(void (*)(void))fast_borrow, METH_FASTCALL, borrow_doc},
    {"call", (PyCFunction)(void (*)(void))fast_call, METH_FASTCALL, call_doc},
    {"launch", (PyCFunction)(void (*)(void))fast_launch, METH_FASTCALL, launch_doc},
    {"launch_direct", (PyCFunction)(void (*)(void))fast_launch_direct, METH_FASTCALL, launch_direct_doc},
    {"configure", (PyCFunction)(void (*)(void))fast_configure, METH_FASTCALL, configure_doc},
    {"configure_device", (PyCFunction)(void (*)(void))fast_configure_device, METH_FASTCALL,
     configure_device_doc},
    {"forked", (PyCFunction)fast_forked, METH_NOARGS, forked_doc},
    {"fork_driver", (PyCFunction)fast_fork_driver, METH_NOARGS, fork_driver_doc},
    {"set_stack_frames", (PyCFunction)(void (*)(void))fast_set_stack_frames, METH_FASTCALL, set_stack_frames_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fast_module = {
    PyModuleDef_HEAD_INIT,
    "_fast",
    "cudacore's METH_FASTCALL entry points into Go (compiled into the gopy extension's library).",
    -1,
    fast_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__fast(void)
{
    if (door_init() < 0 || PyType_Ready(&BufferType) < 0 || PyType_Ready(&PinnedType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&fast_module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddFunctions(m, cudacore_door_methods) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    /* The cold door's fast wrappers (cold_gen.c), named like gopy's C functions, in a module of their own. */
    PyObject *cold = PyModule_New("cudacore._fast.cold");
    if (cold == NULL || PyModule_AddFunctions(cold, cudacore_cold_methods) < 0 || PyModule_AddObject(m, "cold", cold) < 0) {
        Py_XDECREF(cold);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Buffer", (PyObject *)&BufferType) < 0 ||
        PyModule_AddObjectRef(m, "PinnedBuffer", (PyObject *)&PinnedType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
