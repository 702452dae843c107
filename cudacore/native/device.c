/*
 * Device's C base (cudacore._fast.Device): the ordinal the direct path reads from the device of a Stream,
 * Event, Graph or Module. python/cudacore/_device.py subclasses it; Device.__new__ sets the ordinal once,
 * before the object is handed out, and it never changes.
 */
#include "fast.h"

static void
device_dealloc(DeviceObject *self)
{
    if (self->weakreflist != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef device_members[] = {
    {"_ordinal", T_LONGLONG, offsetof(DeviceObject, ordinal), 0, "The device's ordinal (set once, by Device.__new__)."},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject DeviceType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudacore._fast.Device",
    .tp_basicsize = sizeof(DeviceObject),
    .tp_dealloc = (destructor)device_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The fields of a CUDA device the fast path reads (subclassed by cudacore.Device).",
    .tp_weaklistoffset = offsetof(DeviceObject, weakreflist),
    .tp_members = device_members,
};
