/*
 * Module's C base (cudacore._fast.Module): the device and whether the module is loaded, which the direct
 * path checks before it launches a kernel of it. python/cudacore/_module.py subclasses it; its unload()
 * clears loaded, with the GIL held, before Go unloads the module.
 */
#include "fast.h"

static int
module_traverse(ModuleObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->device);
    return 0;
}

static int
module_clear(ModuleObject *self)
{
    Py_CLEAR(self->device);
    return 0;
}

static void
module_dealloc(ModuleObject *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    module_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef module_members[] = {
    {"_device", T_OBJECT_EX, offsetof(ModuleObject, device), 0, "The module's Device."},
    {"_loaded", T_BOOL, offsetof(ModuleObject, loaded), 0, "Whether the module is loaded (its kernels may launch)."},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject ModuleType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudacore._fast.Module",
    .tp_basicsize = sizeof(ModuleObject),
    .tp_dealloc = (destructor)module_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The fields of a loaded kernel image the fast path reads (subclassed by cudacore.Module).",
    .tp_traverse = (traverseproc)module_traverse,
    .tp_clear = (inquiry)module_clear,
    .tp_weaklistoffset = offsetof(ModuleObject, weakreflist),
    .tp_members = module_members,
};
