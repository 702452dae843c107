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
#include "fast.h"

/* What configure() registers (fast.h). */
PyTypeObject *buffer_type;
PyTypeObject *pinned_type;
PyTypeObject *stream_type;

PyDoc_STRVAR(configure_doc, "configure(buffer_type, pinned_type, funnel, stream_type) -> None\n\n"
                            "Register the Python subclasses to instantiate, the error funnel (the "
                            "cudacore._errors module) and the Stream class.");

static PyObject *
fast_configure(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "configure() takes exactly 4 arguments");
        return NULL;
    }
    if (!PyType_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "configure() needs the Stream class");
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
    Py_RETURN_NONE;
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
    if (door_init() < 0 || PyType_Ready(&BufferType) < 0 || PyType_Ready(&PinnedType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&fast_module);
    if (m == NULL) {
        return NULL;
    }
    PyMethodDef *tables[] = {cc_module_functions, cc_alloc_functions, cc_call_functions, cc_launch_functions,
                             cc_hot_functions, cc_stacks_functions, cc_streams_functions, cudacore_door_methods};
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
    if (PyModule_AddObjectRef(m, "Buffer", (PyObject *)&BufferType) < 0 ||
        PyModule_AddObjectRef(m, "PinnedBuffer", (PyObject *)&PinnedType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

