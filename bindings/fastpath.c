/*
 * _fast: the hand-written CPython module for cudacore's hot paths.
 *
 * gopy's wrappers cost a Python-level function, pybindgen argument parsing (PyArg_ParseTupleAndKeywords)
 * and a GIL release/retake per call. Here a METH_FASTCALL function converts its arguments itself and calls
 * a cgo export directly, with the GIL held.
 *
 * This file is compiled by cgo into the same c-shared library as the gopy extension (two Go runtimes in
 * one process crash). Python loads it from that same file under the name cudacore._fast; CPython dlopens
 * the path again, gets the same handle, and looks up PyInit__fast, which does not collide with gopy's
 * PyInit__core.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "fastpath.h"

/* int64 argument i of a fastcall; -1 with an exception set on failure (check PyErr_Occurred). */
static int
arg_int64(PyObject *const *args, Py_ssize_t i, int64_t *out)
{
    long long v = PyLong_AsLongLong(args[i]);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    *out = (int64_t)v;
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

PyDoc_STRVAR(noop_doc, "noop(x: int) -> int\n\nReturn x after a round trip through Go: the floor cost of "
                       "a fast-path call.");

static PyObject *
fast_noop(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t x;
    (void)module;
    if (check_nargs("noop", nargs, 1) < 0 || arg_int64(args, 0, &x) < 0) {
        return NULL;
    }
    return PyLong_FromLongLong((long long)cudacore_fast_noop(x));
}

static PyMethodDef fast_methods[] = {
    {"noop", (PyCFunction)(void (*)(void))fast_noop, METH_FASTCALL, noop_doc},
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
    return PyModule_Create(&fast_module);
}
