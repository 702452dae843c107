/*
 * _fast: the hand-written CPython module for cudacore's hot paths.
 *
 * gopy's wrappers cost a Python-level function, pybindgen argument parsing (PyArg_ParseTupleAndKeywords)
 * and a GIL release/retake per call. Here a METH_FASTCALL function converts its arguments itself and calls
 * a cgo export directly, with the GIL held, and the objects users hold (Buffer, PinnedBuffer) are C types
 * with no per-instance dict. That is what makes an allocate+close pair cost about what CuPy's pool does.
 *
 * This file is compiled by cgo into the same c-shared library as the gopy extension (two Go runtimes in
 * one process crash). Python loads it from that same file under the name cudacore._fast; CPython dlopens
 * the path again, gets the same handle, and looks up PyInit__fast, which does not collide with gopy's
 * PyInit__core.
 *
 * Ownership: a Buffer owns its device allocation and a PinnedBuffer its host allocation from creation
 * until close() or deallocation, whichever comes first; close() is idempotent, so there is never a
 * double free. The Python layer (python/cudacore/_memory.py) subclasses both types to add methods and
 * registers the subclasses and its error translator with configure().
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdlib.h>

#include "fastpath.h"

/* Devices whose allocator can block (the synchronous cuMemAlloc/cuMemFree strategy): their calls drop
 * the GIL. Written by configure_device(), read on every call. */
#define MAX_DEVICES 64
static unsigned char release_gil[MAX_DEVICES];

static PyTypeObject *buffer_type;   /* the registered subclass of Buffer; NULL until configure() */
static PyTypeObject *pinned_type;   /* likewise for PinnedBuffer */
static PyObject *translate_error;   /* callable(RuntimeError) -> typed exception; may be NULL */
static PyObject *closed_error;      /* exception class raised for a closed object */

/* Raise the exception for a wire-format error text from Go, and free the text. */
static void
raise_wire(char *msg)
{
    PyObject *text = PyUnicode_FromString(msg);
    free(msg);
    if (text == NULL) {
        return;
    }
    PyObject *raw = PyObject_CallOneArg(PyExc_RuntimeError, text);
    Py_DECREF(text);
    if (raw == NULL) {
        return;
    }
    if (translate_error != NULL) {
        PyObject *typed = PyObject_CallOneArg(translate_error, raw);
        if (typed == NULL) {
            Py_DECREF(raw);
            return;
        }
        if (typed != raw) {
            PyException_SetCause(typed, raw); /* steals raw */
            PyErr_SetObject((PyObject *)Py_TYPE(typed), typed);
            Py_DECREF(typed);
            return;
        }
        Py_DECREF(typed);
    }
    PyErr_SetObject(PyExc_RuntimeError, raw);
    Py_DECREF(raw);
}

static int
blocking(int64_t ordinal)
{
    return ordinal >= 0 && ordinal < MAX_DEVICES && release_gil[ordinal];
}

static int
arg_int64(PyObject *arg, const char *what, int64_t *out)
{
    if (PyBool_Check(arg) || !PyIndex_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", what, Py_TYPE(arg)->tp_name);
        return -1;
    }
    long long v = PyLong_AsLongLong(arg);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

static int
arg_uint64(PyObject *arg, const char *what, uint64_t *out)
{
    int64_t v;
    if (arg_int64(arg, what, &v) < 0) {
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

static int
check_nargs(const char *fname, Py_ssize_t nargs, Py_ssize_t want)
{
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s() takes exactly %zd argument%s (%zd given)", fname, want,
                     want == 1 ? "" : "s", nargs);
        return -1;
    }
    return 0;
}

static PyObject *
raise_closed(const char *what)
{
    PyErr_Format(closed_error ? closed_error : PyExc_ValueError,
                 "this %s is closed: its memory was freed, so it can no longer be used", what);
    return NULL;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Buffer: device memory                                                                                */

typedef struct {
    PyObject_HEAD
    uint64_t ptr;
    uint64_t size;
    uint64_t stream;
    int64_t device;
    char closed; /* a char: exposed read-only as a bool through PyMemberDef (T_BOOL) */
    PyObject *weakreflist;
    /* A borrowed Buffer (cudacore.interop.ExternalBuffer) views memory another library owns: close() drops
     * the reference to owner and frees nothing. */
    int borrowed;
    PyObject *owner;
    /* DLPack capsules handed out and not yet deleted by their consumer: while any exist, close() refuses
     * (the consumer is still using the memory). Each holds a reference to this object. */
    Py_ssize_t dlpack_exports;
} BufferObject;

/* Free the allocation if still open. Returns 0, or -1 with an exception set. */
static int
buffer_free(BufferObject *self)
{
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
    /* Mark closed before the call: with the GIL dropped another thread may try to close it too. */
    self->closed = 1;
    char *err;
    if (blocking(self->device)) {
        Py_BEGIN_ALLOW_THREADS
        err = cudacore_fast_free(self->device, self->ptr, self->size, self->stream);
        Py_END_ALLOW_THREADS
    } else {
        err = cudacore_fast_free(self->device, self->ptr, self->size, self->stream);
    }
    if (err != NULL) {
        raise_wire(err);
        return -1;
    }
    return 0;
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
    dealloc_owner((PyObject *)self, (int (*)(PyObject *))buffer_free, self->weakreflist);
}

static PyObject *
buffer_close(BufferObject *self, PyObject *Py_UNUSED(ignored))
{
    if (buffer_free(self) < 0) {
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
    if (buffer_free(self) < 0) {
        return NULL;
    }
    Py_RETURN_FALSE;
}

static PyObject *
buffer_get_ptr(BufferObject *self, void *Py_UNUSED(closure))
{
    if (self->closed) {
        return raise_closed("Buffer");
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

/* The CUDA stream value of the DLPack spec as a driver handle: None and 1 the legacy default stream (0 is
 * taken to mean it too), 2 the per-thread default stream, -1 "do not synchronize", else a CUstream. */
static int
dlpack_stream_arg(PyObject *arg, int64_t *out)
{
    if (arg == NULL || arg == Py_None) {
        *out = 1;
        return 0;
    }
    if (arg_int64(arg, "stream", out) < 0) {
        return -1;
    }
    if (*out == 0) {
        *out = 1;
    }
    if (*out < -1) {
        PyErr_Format(PyExc_ValueError, "__dlpack__: stream must be -1, 1, 2 or a CUDA stream handle, got %lld",
                     (long long)*out);
        return -1;
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
    if (self->closed) {
        return raise_closed("Buffer");
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
        dtype = PyLong_AsLongLong(PyTuple_GET_ITEM(dl_device, 0));
        did = PyLong_AsLongLong(PyTuple_GET_ITEM(dl_device, 1));
        if (PyErr_Occurred()) {
            return NULL;
        }
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
        long long major = PyLong_AsLongLong(PyTuple_GET_ITEM(max_version, 0));
        if (major == -1 && PyErr_Occurred()) {
            return NULL;
        }
        versioned = major >= 1;
    }
    int64_t consumer;
    if (dlpack_stream_arg(stream_arg, &consumer) < 0) {
        return NULL;
    }
    /* Stream order: the consumer will use the memory on its stream. If that is not the buffer's stream,
     * wait for the buffer's stream (there is no event in the fast path to make the consumer wait instead). */
    int64_t mine = self->stream == 0 ? 1 : (int64_t)self->stream;
    if (consumer != -1 && consumer != mine && !self->borrowed) {
        char *err;
        Py_BEGIN_ALLOW_THREADS
        err = cudacore_interop_stream_sync(self->device, (uint64_t)mine);
        Py_END_ALLOW_THREADS
        if (err != NULL) {
            raise_wire(err);
            return NULL;
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

static PyMethodDef buffer_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))buffer_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)\n\n"
     "A DLPack capsule of this buffer as a 1-D uint8 tensor (versioned, DLPack 1.0, when max_version >= "
     "(1, 0)). It keeps the buffer alive until the consumer deletes it; close() is refused meanwhile. When "
     "the consumer's stream is not the buffer's, the buffer's stream is synchronized first (stream=-1: never)."},
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

typedef struct {
    PyObject_HEAD
    uint64_t ptr;
    uint64_t size;
    int64_t device;
    char closed; /* a char: exposed read-only as a bool through PyMemberDef (T_BOOL) */
    Py_ssize_t exports; /* live memoryviews: while any exist, close() must refuse */
    PyObject *weakreflist;
} PinnedObject;

static int
pinned_free(PinnedObject *self)
{
    if (self->closed) {
        return 0;
    }
    if (self->exports > 0) {
        PyErr_Format(PyExc_BufferError,
                     "cannot close a PinnedBuffer while %zd view%s of it (memoryview, numpy array) exist%s",
                     self->exports, self->exports == 1 ? "" : "s", self->exports == 1 ? "s" : "");
        return -1;
    }
    self->closed = 1;
    char *err;
    Py_BEGIN_ALLOW_THREADS /* cuMemFreeHost synchronizes the device */
    err = cudacore_fast_pinned_free(self->device, self->ptr);
    Py_END_ALLOW_THREADS
    if (err != NULL) {
        raise_wire(err);
        return -1;
    }
    return 0;
}

static void
pinned_dealloc(PinnedObject *self)
{
    /* No view can exist here: each holds a reference to this object. */
    dealloc_owner((PyObject *)self, (int (*)(PyObject *))pinned_free, self->weakreflist);
}

static int
pinned_getbuffer(PinnedObject *self, Py_buffer *view, int flags)
{
    if (self->closed) {
        raise_closed("PinnedBuffer");
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
    if (pinned_free(self) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
pinned_exit(PinnedObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)args;
    (void)nargs;
    if (pinned_free(self) < 0) {
        return NULL;
    }
    Py_RETURN_FALSE;
}

static PyObject *
pinned_get_ptr(PinnedObject *self, void *Py_UNUSED(closure))
{
    if (self->closed) {
        return raise_closed("PinnedBuffer");
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
/* Module functions                                                                                     */

PyDoc_STRVAR(noop_doc, "noop(x: int) -> int\n\nReturn x after a round trip through Go: the floor cost of "
                       "a fast-path call.");

static PyObject *
fast_noop(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t x;
    (void)module;
    if (check_nargs("noop", nargs, 1) < 0 || arg_int64(args[0], "x", &x) < 0) {
        return NULL;
    }
    return PyLong_FromLongLong((long long)cudacore_fast_noop(x));
}

PyDoc_STRVAR(allocate_doc, "allocate(device: int, size: int, stream: int) -> Buffer\n\n"
                           "Allocate size bytes on device, ordered on the stream handle (0: legacy).");

static PyObject *
fast_allocate(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t device, size;
    uint64_t stream, ptr = 0;
    (void)module;
    if (check_nargs("allocate", nargs, 3) < 0 || arg_int64(args[0], "device", &device) < 0 ||
        arg_int64(args[1], "size", &size) < 0 || arg_uint64(args[2], "stream", &stream) < 0) {
        return NULL;
    }
    if (buffer_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cudacore._fast is not configured");
        return NULL;
    }
    /* Make the object first: if Python is out of memory, nothing on the device has to be undone. */
    BufferObject *b = (BufferObject *)buffer_type->tp_alloc(buffer_type, 0);
    if (b == NULL) {
        return NULL;
    }
    b->closed = 1; /* until the allocation succeeds, dealloc must not free anything */
    char *err;
    if (blocking(device)) {
        Py_BEGIN_ALLOW_THREADS
        err = cudacore_fast_alloc(device, size, stream, &ptr);
        Py_END_ALLOW_THREADS
    } else {
        err = cudacore_fast_alloc(device, size, stream, &ptr);
    }
    if (err != NULL) {
        Py_DECREF(b);
        raise_wire(err);
        return NULL;
    }
    b->ptr = ptr;
    b->size = (uint64_t)size;
    b->stream = stream;
    b->device = device;
    b->closed = 0;
    return (PyObject *)b;
}

PyDoc_STRVAR(allocate_pinned_doc, "allocate_pinned(device: int, size: int) -> PinnedBuffer\n\n"
                                  "Allocate size bytes of page-locked host memory.");

static PyObject *
fast_allocate_pinned(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t device, size;
    uint64_t ptr = 0;
    (void)module;
    if (check_nargs("allocate_pinned", nargs, 2) < 0 || arg_int64(args[0], "device", &device) < 0 ||
        arg_int64(args[1], "size", &size) < 0) {
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
    err = cudacore_fast_pinned_alloc(device, size, &ptr);
    Py_END_ALLOW_THREADS
    if (err != NULL) {
        Py_DECREF(h);
        raise_wire(err);
        return NULL;
    }
    h->ptr = ptr;
    h->size = (uint64_t)size;
    h->device = device;
    h->closed = 0;
    return (PyObject *)h;
}

PyDoc_STRVAR(wrap_doc, "wrap(device: int, ptr: int, size: int, stream: int) -> Buffer\n\n"
                       "A Buffer owning an allocation already made through the device's allocator (for "
                       "example a tile of allocate_tiles). Used by cudacore itself.");

static PyObject *
fast_wrap(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t device, size;
    uint64_t ptr, stream;
    (void)module;
    if (check_nargs("wrap", nargs, 4) < 0 || arg_int64(args[0], "device", &device) < 0 ||
        arg_uint64(args[1], "ptr", &ptr) < 0 || arg_int64(args[2], "size", &size) < 0 ||
        arg_uint64(args[3], "stream", &stream) < 0) {
        return NULL;
    }
    if (buffer_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cudacore._fast is not configured");
        return NULL;
    }
    BufferObject *b = (BufferObject *)buffer_type->tp_alloc(buffer_type, 0);
    if (b == NULL) {
        return NULL;
    }
    b->ptr = ptr;
    b->size = (uint64_t)size;
    b->stream = stream;
    b->device = device;
    b->closed = 0;
    return (PyObject *)b;
}

PyDoc_STRVAR(borrow_doc, "borrow(type, device: int, ptr: int, size: int, stream: int, owner) -> Buffer\n\n"
                         "A Buffer of the given Buffer subclass viewing memory that owner owns: it keeps owner "
                         "alive until close(), and frees nothing. Used by cudacore.interop.");

static PyObject *
fast_borrow(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t device, size;
    uint64_t ptr, stream;
    (void)module;
    if (check_nargs("borrow", nargs, 6) < 0) {
        return NULL;
    }
    if (!PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], &BufferType)) {
        PyErr_SetString(PyExc_TypeError, "borrow() needs a subclass of Buffer");
        return NULL;
    }
    if (arg_int64(args[1], "device", &device) < 0 || arg_uint64(args[2], "ptr", &ptr) < 0 ||
        arg_int64(args[3], "size", &size) < 0 || arg_uint64(args[4], "stream", &stream) < 0) {
        return NULL;
    }
    if (size < 0) {
        PyErr_Format(PyExc_ValueError, "borrow(): size must be >= 0, got %lld", (long long)size);
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)args[0];
    BufferObject *b = (BufferObject *)type->tp_alloc(type, 0);
    if (b == NULL) {
        return NULL;
    }
    b->ptr = ptr;
    b->size = (uint64_t)size;
    b->stream = stream;
    b->device = device;
    b->borrowed = 1;
    b->owner = Py_NewRef(args[5]);
    b->closed = 0;
    return (PyObject *)b;
}

PyDoc_STRVAR(graph_launch_doc, "graph_launch(graph_id: int, device: int, stream: int) -> None\n\n"
                               "Launch a captured graph on a stream handle of its device (Graph.launch).");

static PyObject *
fast_graph_launch(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t id, device, stream;
    (void)module;
    if (check_nargs("graph_launch", nargs, 3) < 0 || arg_int64(args[0], "graph_id", &id) < 0 ||
        arg_int64(args[1], "device", &device) < 0 || arg_int64(args[2], "stream", &stream) < 0) {
        return NULL;
    }
    char *err = cudacore_fast_graph_launch(id, device, stream);
    if (err != NULL) {
        raise_wire(err);
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(configure_doc, "configure(buffer_type, pinned_type, translate_error, closed_error) -> None\n\n"
                            "Register the Python subclasses to instantiate, the callable that turns a "
                            "wire-format RuntimeError into a typed exception, and the exception class for "
                            "using a closed object.");

static PyObject *
fast_configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (check_nargs("configure", nargs, 4) < 0) {
        return NULL;
    }
    if (!PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], &BufferType) ||
        !PyType_Check(args[1]) || !PyType_IsSubtype((PyTypeObject *)args[1], &PinnedType)) {
        PyErr_SetString(PyExc_TypeError, "configure() needs subclasses of Buffer and PinnedBuffer");
        return NULL;
    }
    Py_XSETREF(buffer_type, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(pinned_type, (PyTypeObject *)Py_NewRef(args[1]));
    Py_XSETREF(translate_error, Py_NewRef(args[2]));
    Py_XSETREF(closed_error, Py_NewRef(args[3]));
    Py_RETURN_NONE;
}

PyDoc_STRVAR(configure_device_doc, "configure_device(device: int, blocking: bool) -> None\n\n"
                                   "Whether the device's allocator can block (the synchronous strategy), so "
                                   "that its calls release the GIL.");

static PyObject *
fast_configure_device(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t device;
    (void)module;
    if (check_nargs("configure_device", nargs, 2) < 0 || arg_int64(args[0], "device", &device) < 0) {
        return NULL;
    }
    int flag = PyObject_IsTrue(args[1]);
    if (flag < 0) {
        return NULL;
    }
    if (device >= 0 && device < MAX_DEVICES) {
        release_gil[device] = (unsigned char)flag;
    }
    Py_RETURN_NONE;
}

static PyMethodDef fast_methods[] = {
    {"noop", (PyCFunction)(void (*)(void))fast_noop, METH_FASTCALL, noop_doc},
    {"allocate", (PyCFunction)(void (*)(void))fast_allocate, METH_FASTCALL, allocate_doc},
    {"allocate_pinned", (PyCFunction)(void (*)(void))fast_allocate_pinned, METH_FASTCALL, allocate_pinned_doc},
    {"wrap", (PyCFunction)(void (*)(void))fast_wrap, METH_FASTCALL, wrap_doc},
    {"borrow", (PyCFunction)(void (*)(void))fast_borrow, METH_FASTCALL, borrow_doc},
    {"graph_launch", (PyCFunction)(void (*)(void))fast_graph_launch, METH_FASTCALL, graph_launch_doc},
    {"configure", (PyCFunction)(void (*)(void))fast_configure, METH_FASTCALL, configure_doc},
    {"configure_device", (PyCFunction)(void (*)(void))fast_configure_device, METH_FASTCALL,
     configure_device_doc},
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
    if (PyType_Ready(&BufferType) < 0 || PyType_Ready(&PinnedType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&fast_module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Buffer", (PyObject *)&BufferType) < 0 ||
        PyModule_AddObjectRef(m, "PinnedBuffer", (PyObject *)&PinnedType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
