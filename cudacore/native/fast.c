/*
 * _fast: the C module of cudacore's hot paths, compiled into the one extension library.
 *
 * It holds what a generator cannot express: the objects users hold (Buffer and PinnedBuffer, C types
 * with no per-instance dict, so that an allocate+close pair costs about what CuPy's pool does), their
 * DLPack export, the C bases of Device, Stream, Event, Graph, Module, Kernel and KernelArg (the fields
 * the fast path reads, and the hot methods), and the cold door `call` around gopy's functions. The generated METH_FASTCALL wrappers
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
#include "fast.h"

/* What configure() registers (fast.h). */
PyTypeObject *buffer_type;
PyTypeObject *pinned_type;

PyDoc_STRVAR(configure_doc, "configure(buffer_type, pinned_type, funnel) -> None\n\n"
                            "Register the Python subclasses to instantiate and the error funnel (the "
                            "cudacore._errors module).");

static PyObject *
fast_configure(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "configure() takes exactly 3 arguments");
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
    Py_RETURN_NONE;
}

PyObject *
call_general(PyObject *self, PyObject *name, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    Py_ssize_t total = nargs + (kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *small[8];
    PyObject **stack = total < 8 ? small : PyMem_Malloc((size_t)(total + 1) * sizeof(PyObject *));
    if (stack == NULL) {
        return PyErr_NoMemory();
    }
    stack[0] = self;
    memcpy(stack + 1, args, (size_t)total * sizeof(PyObject *));
    PyObject *r = PyObject_VectorcallMethod(name, stack, (size_t)(nargs + 1), kwnames);
    if (stack != small) {
        PyMem_Free(stack);
    }
    return r;
}

/* The arguments of a hot method, by position or keyword, into out[0..n) (borrowed; NULL where not given):
 * 0, or -1 when they do not fit names (the general path then says what is wrong). Never sets an exception. */
int
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

PyDoc_STRVAR(capturing_doc, "capturing() -> bool\n\n"
                            "Whether any stream of cudacore's captures, as the snapshot Go publishes says (from "
                            "the moment a capture is registered, before the driver begins it, until the driver "
                            "ended it).");

static PyObject *
fast_capturing(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(cc_snapshot_capturing());
}

PyDoc_STRVAR(direct_enabled_doc, "direct_enabled(device: int) -> bool\n\n"
                                 "Whether the device's hot calls may take the direct path, as the snapshot Go "
                                 "publishes when it opens the device says (CUDACORE_DIRECT=0 turns it off).");

static PyObject *
fast_direct_enabled(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    int64_t device;
    if (door_enter("direct_enabled", nargs, 1) < 0 || door_int(args[0], "direct_enabled", "device", &device) < 0) {
        return NULL;
    }
    return PyBool_FromLong(direct_enabled(device));
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

/* The finalizer of the Python layer's owners (Owner, Stream, Event, Graph: their __del__ is `finalizer`,
 * an instance method of this function). Python runs a SIGINT's handler wherever the main thread is, a
 * finalizer included, and drops the KeyboardInterrupt raised there (an "Exception ignored"): a finalizer in
 * Python would then stop where the signal came, its object gone with what it still owned, and the Ctrl-C
 * lost. This one is C, so no signal is handled between the collector's call and obj._finalize(): where that
 * raises KeyboardInterrupt it is called again (each _finalize gives back what is left, and nothing twice),
 * and once it is done the interrupt is delivered again (PyErr_SetInterrupt), to be raised at the next point
 * where Python handles a signal, past the finalizer. Any other error of _finalize is the collector's to
 * report. */
#define FINALIZE_TRIES 64

PyDoc_STRVAR(finalize_doc, "finalize(obj, /) -> None\n\n"
                           "Call obj._finalize() until it returns without a KeyboardInterrupt (at most 64 "
                           "times), then deliver the interrupts it met again, past the finalizer. The "
                           "module's `finalizer` is this function as an instance method: a class's "
                           "__del__.");

static PyObject *
fast_finalize(PyObject *Py_UNUSED(module), PyObject *obj)
{
    int interrupted = 0;
    PyObject *res = NULL;
    for (int i = 0; i < FINALIZE_TRIES; i++) {
        res = PyObject_CallMethod(obj, "_finalize", NULL);
        if (res != NULL || !PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
            break;
        }
        PyErr_Clear();
        interrupted = 1;
    }
    if (interrupted) {
        PyErr_SetInterrupt();
    }
    if (res == NULL && !PyErr_Occurred()) {
        Py_RETURN_NONE; /* interrupted at every try: the last interrupt delivered again, nothing to report */
    }
    if (res == NULL) {
        return NULL;
    }
    Py_DECREF(res);
    Py_RETURN_NONE;
}

static PyMethodDef finalize_def = {"finalize", (PyCFunction)fast_finalize, METH_O, finalize_doc};

static PyMethodDef cc_module_functions[] = {
    {"configure", (PyCFunction)(void (*)(void))fast_configure, METH_FASTCALL, configure_doc},
    {"capturing", (PyCFunction)fast_capturing, METH_NOARGS, capturing_doc},
    {"direct_enabled", (PyCFunction)(void (*)(void))fast_direct_enabled, METH_FASTCALL, direct_enabled_doc},
    {"forked", (PyCFunction)fast_forked, METH_NOARGS, forked_doc},
    {"fork_driver", (PyCFunction)fast_fork_driver, METH_NOARGS, fork_driver_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fast_module = {
    PyModuleDef_HEAD_INIT,
    "_fast",
    "cudacore's METH_FASTCALL entry points into Go (compiled into the gopy extension's library).",
    -1,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__fast(void)
{
    if (door_init() < 0 || PyType_Ready(&BufferType) < 0 || PyType_Ready(&PinnedType) < 0 || PyType_Ready(&UseType) < 0) {
        return NULL;
    }
    /* The C bases of the Python layer's classes, by the names they are exported under. Their tp_new is
     * object's own: an instance starts zeroed, and object.__new__(cls), with which the Python layer makes
     * its objects, stays valid for their subclasses. */
    static struct {
        const char *name;
        PyTypeObject *type;
    } bases[] = {{"Device", &DeviceType}, {"Stream", &StreamType}, {"Event", &EventType}, {"Graph", &GraphType},
                 {"Module", &ModuleType}, {"Kernel", &KernelType}, {"KernelArg", &KernelArgType}};
    for (size_t i = 0; i < sizeof bases / sizeof bases[0]; i++) {
        bases[i].type->tp_new = PyBaseObject_Type.tp_new;
        if (PyType_Ready(bases[i].type) < 0) {
            return NULL;
        }
    }
    PyObject *m = PyModule_Create(&fast_module);
    if (m == NULL) {
        return NULL;
    }
    PyMethodDef *tables[] = {cc_module_functions, cc_alloc_functions, cc_buffer_functions, cc_call_functions, cc_launch_functions,
                             cc_stacks_functions, cc_streams_functions, cudacore_door_methods};
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
        if (PyModule_AddFunctions(m, tables[i]) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    /* The cold door's fast wrappers (cold_gen.c), named like gopy's C functions, in a module of their own. */
    PyObject *cold = PyModule_New("cudacore._fast.cold");
    if (cold == NULL || PyModule_AddFunctions(cold, cudacore_cold_methods) < 0 || PyModule_AddObject(m, "cold", cold) < 0) {
        Py_XDECREF(cold);
        Py_DECREF(m);
        return NULL;
    }
    PyObject *finalize = PyCFunction_New(&finalize_def, NULL);
    PyObject *finalizer = finalize == NULL ? NULL : PyInstanceMethod_New(finalize);
    if (finalizer == NULL || PyModule_AddObject(m, "finalize", finalize) < 0) {
        Py_XDECREF(finalizer);
        Py_XDECREF(finalize);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddObject(m, "finalizer", finalizer) < 0) {
        Py_DECREF(finalizer);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Buffer", (PyObject *)&BufferType) < 0 ||
        PyModule_AddObjectRef(m, "PinnedBuffer", (PyObject *)&PinnedType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    for (size_t i = 0; i < sizeof bases / sizeof bases[0]; i++) {
        if (PyModule_AddObjectRef(m, bases[i].name, (PyObject *)bases[i].type) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}

