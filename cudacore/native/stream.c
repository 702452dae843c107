/*
 * Stream's C base (cudacore._fast.Stream): the fields the direct path checks (the device, the driver
 * handle, whether this process owns the stream and whether it is closed) and the hot methods synchronize
 * and query. python/cudacore/_stream.py subclasses it; its close() clears owned and sets closed, with the
 * GIL held, before Go destroys the stream, so a check that reads them is good until the driver has the call.
 * The general path of each hot method is the subclass's _synchronize / _query, with the same signature.
 */
#include "fast.h"

static int
stream_traverse(StreamObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->device);
    return 0;
}

static int
stream_clear(StreamObject *self)
{
    Py_CLEAR(self->device);
    return 0;
}

static void
stream_dealloc(StreamObject *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    stream_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The handle of a Stream the direct path may query or wait on (direct_stream), with its device's ordinal
 * in *device; 0 when not. */
static uint64_t
direct_own_stream(PyObject *self, int64_t *device)
{
    *device = ordinal_of(((StreamObject *)self)->device);
    return *device >= 0 && !cudacore_forked ? direct_stream(self, *device) : 0;
}

static int64_t
monotonic_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* How long a direct wait queries with the GIL held before it hands the wait to the general path, which
 * waits in GIL-released, interruptible slices through Go. Most synchronizes follow copies and launches of
 * a few microseconds to a few tens; a wait this short delays other threads no more than any GIL-held driver
 * call does, and querying from C reacts within one query of the work's end. */
#define DIRECT_SPIN_NS 20000

int
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

static PyObject *
stream_synchronize(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    int64_t device;
    uint64_t h = nargs == 0 && kwnames == NULL ? direct_own_stream(self, &device) : 0;
    if (h != 0 && direct_spin(direct_stream_query, device, h) == 1) {
        Py_RETURN_NONE;
    }
    GENERAL_NAME(name, "_synchronize");
    return call_general(self, name, args, nargs, kwnames);
}

static PyObject *
stream_query(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    int64_t device;
    uint64_t h = nargs == 0 && kwnames == NULL ? direct_own_stream(self, &device) : 0;
    int r = h != 0 ? direct_stream_query(device, h) : -1;
    if (r >= 0) {
        return PyBool_FromLong(r);
    }
    GENERAL_NAME(name, "_query");
    return call_general(self, name, args, nargs, kwnames);
}

PyDoc_STRVAR(stream_synchronize_doc,
             "synchronize($self, /)\n--\n\n"
             "Wait until all work on the stream has finished. For the first 20 µs the wait queries with the\n"
             "GIL held (most waits end there); a longer one releases the GIL in slices, so other threads run\n"
             "meanwhile and Ctrl-C stops it.\n\n"
             "Raises\n------\nCaptureError\n"
             "    If the stream is capturing, or a capture forbids waiting here (GLOBAL anywhere, THREAD_LOCAL on\n"
             "    this thread).\n");

PyDoc_STRVAR(stream_query_doc, "query($self, /)\n--\n\nWhether all work on the stream has finished (without waiting).");

static PyMethodDef stream_methods[] = {
    {"synchronize", (PyCFunction)(void (*)(void))stream_synchronize, METH_FASTCALL | METH_KEYWORDS, stream_synchronize_doc},
    {"query", (PyCFunction)(void (*)(void))stream_query, METH_FASTCALL | METH_KEYWORDS, stream_query_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef stream_members[] = {
    {"_device", T_OBJECT_EX, offsetof(StreamObject, device), 0, "The stream's Device."},
    {"_handle", T_LONGLONG, offsetof(StreamObject, handle), 0, "The driver's stream handle."},
    {"_owned", T_BOOL, offsetof(StreamObject, owned), 0, "Whether this object owns (and close() destroys) the stream."},
    {"_closed", T_BOOL, offsetof(StreamObject, closed), 0, "Whether close() destroyed the stream."},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject StreamType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudacore._fast.Stream",
    .tp_basicsize = sizeof(StreamObject),
    .tp_dealloc = (destructor)stream_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The fields and hot methods of a CUDA stream (subclassed by cudacore.Stream).",
    .tp_traverse = (traverseproc)stream_traverse,
    .tp_clear = (inquiry)stream_clear,
    .tp_weaklistoffset = offsetof(StreamObject, weakreflist),
    .tp_methods = stream_methods,
    .tp_members = stream_members,
};
