/*
 * Kernel's and KernelArg's C bases (cudacore._fast.Kernel, cudacore._fast.KernelArg). A Kernel holds the
 * driver's function handle the direct path launches (once Go has handed it out), its Module and its
 * launch spec, and has the hot method launch, whose general path is the subclass's _launch
 * (python/cudacore/_module.py), with the same signature. A KernelArg (cudacore.int32(...)) holds the kind's
 * code and the value encoded once, which the launch packs as they are.
 */
#include "fast.h"

static int
kernel_traverse(KernelObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->module);
    Py_VISIT(self->spec);
    return 0;
}

static int
kernel_clear(KernelObject *self)
{
    Py_CLEAR(self->module);
    Py_CLEAR(self->spec);
    return 0;
}

static void
kernel_dealloc(KernelObject *self)
{
    PyObject_GC_UnTrack(self);
    kernel_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* launch(grid, block, args, shared_mem, stream) with an int grid and block, an int shared_mem and a Stream
 * takes the direct path when it may; everything else is the general path's. */
static PyObject *
kernel_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"grid", "block", "args", "shared_mem", "stream"};
    PyObject *a[5];
    if (hot_args(args, nargs, kwnames, names, 5, a) == 0 && a[0] != NULL && a[1] != NULL && a[2] != NULL) {
        int64_t grid = int_of(a[0]), block = int_of(a[1]), shared = a[3] == NULL ? 0 : int_of(a[3]);
        if (grid >= 1 && block >= 1 && shared >= 0) {
            const int64_t v[7] = {grid, 1, 1, block, 1, 1, shared};
            int r = kernel_direct(self, v, a[4], a[2]);
            if (r < 0) {
                return NULL;
            }
            if (r == 1) {
                Py_RETURN_NONE;
            }
        }
    }
    GENERAL_NAME(name, "_launch");
    return call_general(self, name, args, nargs, kwnames);
}

PyDoc_STRVAR(kernel_launch_doc,
             "launch($self, /, grid=1, block=1, args=(), shared_mem=0, stream=None)\n--\n\n"
             "Launch the kernel asynchronously on ``stream`` (None: the current stream of the kernel's device).\n\n"
             "``grid`` and ``block`` are an int or a tuple of up to three ints. ``args`` are ints, floats, device\n"
             "buffers (objects with ``.ptr`` or ``__cuda_array_interface__``), bytes (a struct by value) or typed\n"
             "values (:func:`int32`, :func:`float32`, ...).\n\n"
             "Raises\n------\n"
             "InvalidValueError\n"
             "    Before the driver: a block or grid beyond the device's or the kernel's limits, too much shared\n"
             "    memory, the wrong number of arguments, a value that does not fit its parameter.\n"
             "LaunchError\n"
             "    The launch needs more registers or shared memory than the device has.\n"
             "TypeError\n"
             "    An argument of a kind that cannot be passed, or of the wrong kind for its parameter.\n"
             "NotSupportedError\n"
             "    On the simulator, which runs no device code.\n");

static PyMethodDef kernel_methods[] = {
    {"launch", (PyCFunction)(void (*)(void))kernel_launch, METH_FASTCALL | METH_KEYWORDS, kernel_launch_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef kernel_members[] = {
    {"_direct", T_LONGLONG, offsetof(KernelObject, direct), 0,
     "The driver's function handle for the direct path, once Go has launched the kernel (0 before)."},
    {"_module", T_OBJECT_EX, offsetof(KernelObject, module), 0, "The kernel's Module (kept loaded while the kernel is reachable)."},
    {"_spec", T_OBJECT_EX, offsetof(KernelObject, spec), 0, "The launch spec the C packer reads (bytes), or None."},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject KernelType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudacore._fast.Kernel",
    .tp_basicsize = sizeof(KernelObject),
    .tp_dealloc = (destructor)kernel_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The fields and hot method of a kernel function (subclassed by cudacore.Kernel).",
    .tp_traverse = (traverseproc)kernel_traverse,
    .tp_clear = (inquiry)kernel_clear,
    .tp_methods = kernel_methods,
    .tp_members = kernel_members,
};

static int
kernel_arg_traverse(KernelArgObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->raw);
    return 0;
}

static int
kernel_arg_clear(KernelArgObject *self)
{
    Py_CLEAR(self->raw);
    return 0;
}

static void
kernel_arg_dealloc(KernelArgObject *self)
{
    PyObject_GC_UnTrack(self);
    kernel_arg_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef kernel_arg_members[] = {
    {"_code", T_LONGLONG, offsetof(KernelArgObject, code), 0, "The kind's argument code (0 until set)."},
    {"_raw", T_OBJECT_EX, offsetof(KernelArgObject, raw), 0, "The value encoded as the kernel receives it (bytes)."},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject KernelArgType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudacore._fast.KernelArg",
    .tp_basicsize = sizeof(KernelArgObject),
    .tp_dealloc = (destructor)kernel_arg_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The fields of a typed kernel argument the launch packs (subclassed by cudacore.KernelArg).",
    .tp_traverse = (traverseproc)kernel_arg_traverse,
    .tp_clear = (inquiry)kernel_arg_clear,
    .tp_members = kernel_arg_members,
};
