/*
 * PinnedBuffer: page-locked host memory as a C type with the buffer protocol. It owns its host allocation
 * until a close() or deallocation whose free succeeds; close() refuses while memoryviews of it live.
 */
#include "fast.h"

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

PyTypeObject PinnedType = {
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

