/*
 * Event's C base (cudacore._fast.Event): the device and the driver handle the direct path queries, and the
 * hot methods synchronize and query. python/cudacore/_stream.py subclasses it; its close()
 * clears the handle, with the GIL held, before Go destroys the event. The general path of each hot method is
 * the subclass's _synchronize / _query, with the same signature.
 */
#include "fast.h"

static int
event_traverse(EventObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->device);
    return 0;
}

static int
event_clear(EventObject *self)
{
    Py_CLEAR(self->device);
    return 0;
}

static void
event_dealloc(EventObject *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    event_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The handle of an Event the direct path may query, with its device's ordinal in *device; 0 when the query
 * must go through Go. Never sets an exception. */
static uint64_t
direct_event(PyObject *self, int64_t *device)
{
    EventObject *e = (EventObject *)self;
    if (cc_snapshot_capturing() || cudacore_forked) {
        return 0;
    }
    *device = ordinal_of(e->device);
    return e->handle > 0 && *device >= 0 && direct_enabled(*device) ? (uint64_t)e->handle : 0;
}

static PyObject *
event_synchronize(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    int64_t device;
    uint64_t h = nargs == 0 && kwnames == NULL ? direct_event(self, &device) : 0;
    if (h != 0 && direct_spin(direct_event_query, device, h) == 1) {
        Py_RETURN_NONE;
    }
    GENERAL_NAME(name, "_synchronize");
    return call_general(self, name, args, nargs, kwnames);
}

static PyObject *
event_query(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    int64_t device;
    uint64_t h = nargs == 0 && kwnames == NULL ? direct_event(self, &device) : 0;
    int r = h != 0 ? direct_event_query(device, h) : -1;
    if (r >= 0) {
        return PyBool_FromLong(r);
    }
    GENERAL_NAME(name, "_query");
    return call_general(self, name, args, nargs, kwnames);
}

PyDoc_STRVAR(event_synchronize_doc,
             "synchronize($self, /)\n--\n\n"
             "Wait for the work the event recorded: as :meth:`Stream.synchronize`, 20 µs with the GIL held,\n"
             "then in GIL-released slices that let other threads run and Ctrl-C stop the wait.");

PyDoc_STRVAR(event_query_doc, "query($self, /)\n--\n\nWhether the work the event recorded has finished.");

static PyMethodDef event_methods[] = {
    {"synchronize", (PyCFunction)(void (*)(void))event_synchronize, METH_FASTCALL | METH_KEYWORDS, event_synchronize_doc},
    {"query", (PyCFunction)(void (*)(void))event_query, METH_FASTCALL | METH_KEYWORDS, event_query_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef event_members[] = {
    {"_device", T_OBJECT_EX, offsetof(EventObject, device), 0, "The event's Device."},
    {"_handle", T_LONGLONG, offsetof(EventObject, handle), 0, "The driver's event handle (0: closed)."},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject EventType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudacore._fast.Event",
    .tp_basicsize = sizeof(EventObject),
    .tp_dealloc = (destructor)event_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The fields and hot methods of a CUDA event (subclassed by cudacore.Event).",
    .tp_traverse = (traverseproc)event_traverse,
    .tp_clear = (inquiry)event_clear,
    .tp_weaklistoffset = offsetof(EventObject, weakreflist),
    .tp_methods = event_methods,
    .tp_members = event_members,
};
