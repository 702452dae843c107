/*
 * Allocation into new Buffers and PinnedBuffers: Device.allocate's door (the recycle log's C side first,
 * the orphans given back and one retry on out of memory), pinned memory, and wrap / borrow, which make
 * Buffers of memory Go or another library allocated.
 */
#include "fast.h"

/* Hand a new device buffer to the capture bookkeeping of the Python layer when Go allocated it as graph
 * memory (it gave the allocation an owner token), which the graph's end may void. Decided by the
 * allocation's own fact, not by whether a capture runs when the call returns: a capture may end while an
 * allocation that released the GIL is in flight. 0, or -1. */
int
note_if_capturing(PyObject *buf)
{
    if (((BufferObject *)buf)->graph_token == 0 || capture_noter == NULL) {
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
int
recycle_ok(void)
{
    return !cc_snapshot_capturing() && stack_frames == 0;
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
    if (b != NULL && sa != Py_None && !PyLong_Check(sa) && !PyObject_TypeCheck(sa, &StreamType)) {
        ((BufferObject *)b)->keep = Py_NewRef(sa); /* another library's stream object: alive until the free */
    }
    if (b != NULL && note_if_capturing(b) < 0) {
        Py_DECREF(b); /* the allocation is freed with the object */
        return NULL;
    }
    return b;
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

/* The module functions of this file, added to cudacore._fast at init (fast.c). */
PyMethodDef cc_alloc_functions[] = {
    {"allocate", (PyCFunction)(void (*)(void))fast_allocate, METH_FASTCALL, allocate_doc},
    {"device_allocate", (PyCFunction)(void (*)(void))fast_device_allocate, METH_FASTCALL, device_allocate_doc},
    {"allocate_pinned", (PyCFunction)(void (*)(void))fast_allocate_pinned, METH_FASTCALL, allocate_pinned_doc},
    {"wrap", (PyCFunction)(void (*)(void))fast_wrap, METH_FASTCALL, wrap_doc},
    {"borrow", (PyCFunction)(void (*)(void))fast_borrow, METH_FASTCALL, borrow_doc},
    {NULL, NULL, 0, NULL},
};
