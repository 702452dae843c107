/*
 * The cold door: `call(fn, *args)` calls one of gopy's functions and sends its error through the one
 * funnel (door_raise), naming the parameter a bad argument was given for.
 */
#include "fast.h"

PyDoc_STRVAR(call_doc, "call(fn, *args)\n\n"
                       "The cold door: call one of gopy's generated functions after the fork check, and turn "
                       "the RuntimeError it raises for a Go error into the typed exception (the original is "
                       "its __cause__).");

/* The name of fn's parameter i as Python users spell it (gopy keeps the Go names: tileSize becomes
 * tile_size), or "argument <i+1>" when fn has no code object. Only used on an error path. */
static void
param_name(PyObject *fn, Py_ssize_t i, char *out, size_t n)
{
    snprintf(out, n, "argument %zd", i + 1);
    PyObject *code = PyObject_GetAttrString(fn, "__code__");
    if (code == NULL) {
        /* gopy's C function itself (see cudacore._native): its Python wrapper knows the names. */
        PyErr_Clear();
        PyObject *native = PyImport_ImportModule("cudacore._native");
        PyObject *wrappers = native != NULL ? PyObject_GetAttrString(native, "gopy_wrappers") : NULL;
        PyObject *name = PyObject_GetAttrString(fn, "__name__");
        PyObject *wrapper = wrappers != NULL && name != NULL && PyDict_Check(wrappers) ? PyDict_GetItem(wrappers, name) : NULL;
        code = wrapper != NULL ? PyObject_GetAttrString(wrapper, "__code__") : NULL;
        Py_XDECREF(name);
        Py_XDECREF(wrappers);
        Py_XDECREF(native);
    }
    PyObject *names = code != NULL ? PyObject_GetAttrString(code, "co_varnames") : NULL;
    PyErr_Clear();
    if (names != NULL && PyTuple_Check(names) && i < PyTuple_GET_SIZE(names)) {
        const char *go = PyUnicode_AsUTF8(PyTuple_GET_ITEM(names, i));
        if (go != NULL) {
            size_t k = 0;
            for (const char *c = go; *c != '\0' && k + 2 < n; c++) {
                if (*c >= 'A' && *c <= 'Z') {
                    if (k > 0) {
                        out[k++] = '_';
                    }
                    out[k++] = (char)(*c - 'A' + 'a');
                } else {
                    out[k++] = *c;
                }
            }
            out[k] = '\0';
        }
        PyErr_Clear();
    }
    Py_XDECREF(names);
    Py_XDECREF(code);
}

static PyObject *
fast_call(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "call() needs the function to call");
        return NULL;
    }
    if (cudacore_forked) {
        PyObject *name = PyObject_GetAttrString(args[0], "__name__");
        const char *fn = name != NULL && PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
        PyErr_Clear();
        if (fn != NULL && strncmp(fn, "cudacore_", 9) == 0) {
            fn += 9;
        }
        door_check_fork(fn != NULL ? fn : "call");
        Py_XDECREF(name);
        return NULL;
    }
    /* A cold wrapper (cold_gen.c) checks its own arguments, naming them, after the fork check, and raises
     * the typed exception itself: straight in. */
    if (PyCFunction_Check(args[0]) && (PyCFunction_GET_FLAGS(args[0]) & METH_FASTCALL) != 0) {
        return PyObject_Vectorcall(args[0], args + 1, (size_t)(nargs - 1), NULL);
    }
    /* gopy's wrappers take Go ints as C long long: a Python int beyond int64 would be a bare OverflowError
     * naming nothing. Refuse it here, naming the function and the argument's position. */
    for (Py_ssize_t i = 1; i < nargs; i++) {
        if (PyLong_Check(args[i]) && !PyBool_Check(args[i])) {
            int overflow = 0;
            (void)PyLong_AsLongLongAndOverflow(args[i], &overflow);
            if (overflow != 0) {
                PyObject *name = PyObject_GetAttrString(args[0], "__name__");
                const char *fn = name != NULL && PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
                if (fn != NULL && strncmp(fn, "cudacore_", 9) == 0) {
                    fn += 9; /* gopy's C function: cudacore_<Name> */
                }
                PyErr_Clear();
                char arg[64];
                param_name(args[0], i - 1, arg, sizeof arg);
                door_invalid(fn != NULL ? fn : "call", arg, "must be an integer in [-2**63, 2**63)", args[i]);
                Py_XDECREF(name);
                return NULL;
            }
        }
    }
    PyObject *r = PyObject_Vectorcall(args[0], args + 1, (size_t)(nargs - 1), NULL);
    if (r != NULL || !PyErr_ExceptionMatches(PyExc_RuntimeError)) {
        return r;
    }
    return door_translate();
}

/* The module functions of this file, added to cudacore._fast at init (fast.c). */
PyMethodDef cc_call_functions[] = {
    {"call", (PyCFunction)(void (*)(void))fast_call, METH_FASTCALL, call_doc},
    {NULL, NULL, 0, NULL},
};
