/* The C guard of the one door into Go: see door.h. */
#include "door.h"
#include "snapshot.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

volatile int cudacore_forked;
volatile int cudacore_fork_driver;

int
door_blocking(int64_t ordinal)
{
    return cc_snapshot_blocking(ordinal);
}

/* The funnel's functions, looked up once by door_configure. Until then errors are RuntimeErrors. */
static PyObject *from_wire; /* (text: str) -> CUDAError */
static PyObject *forked_error; /* (op: str) -> IllegalStateError */
static PyObject *closed_error; /* (what: str, op: str) -> CUDAError with CUDACORE_ERROR_CLOSED */
static PyObject *invalid_argument; /* (op: str, arg: str, detail: str, value) -> InvalidValueError */

/* Before a fork, in the parent: whether any library of the process loaded and initialised the CUDA
 * driver (not only cudacore: PyTorch, CuPy or Numba may have called cuInit), so that the child's error
 * can say so. RTLD_NOLOAD finds libcuda only if it is loaded already; cuDeviceGetCount answers
 * CUDA_ERROR_NOT_INITIALIZED (3) until someone called cuInit. CUDACORE_LIBCUDA names the library as for
 * the driver itself. */
static void
before_fork_in_parent(void)
{
    const char *name = getenv("CUDACORE_LIBCUDA");
    int state = CUDACORE_FORK_DRIVER_ABSENT;
    void *h = dlopen(name && *name ? name : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (h != NULL) {
        state = CUDACORE_FORK_DRIVER_LOADED;
        int (*count)(int *) = (int (*)(int *))dlsym(h, "cuDeviceGetCount");
        int n = 0;
        if (count != NULL && count(&n) == 0) {
            state = CUDACORE_FORK_DRIVER_INITIALIZED;
        }
        dlclose(h);
    }
    cudacore_fork_driver = state;
}

static void
after_fork_in_child(void)
{
    cudacore_forked = 1;
}

int
door_init(void)
{
    static int registered;
    if (!registered) {
        if (pthread_atfork(before_fork_in_parent, NULL, after_fork_in_child) != 0) {
            PyErr_SetString(PyExc_ImportError, "cudacore: pthread_atfork failed");
            return -1;
        }
        registered = 1;
    }
    return 0;
}

int
door_configure(PyObject *funnel)
{
    PyObject *fw = PyObject_GetAttrString(funnel, "from_wire");
    PyObject *fk = PyObject_GetAttrString(funnel, "forked_error");
    PyObject *cl = PyObject_GetAttrString(funnel, "closed_error");
    PyObject *ia = PyObject_GetAttrString(funnel, "invalid_argument");
    if (fw == NULL || fk == NULL || cl == NULL || ia == NULL) {
        Py_XDECREF(fw);
        Py_XDECREF(fk);
        Py_XDECREF(cl);
        Py_XDECREF(ia);
        return -1;
    }
    Py_XSETREF(from_wire, fw);
    Py_XSETREF(forked_error, fk);
    Py_XSETREF(closed_error, cl);
    Py_XSETREF(invalid_argument, ia);
    return 0;
}

/* Raise the exception instance a funnel function returns; steals exc. */
static void
raise_instance(PyObject *exc)
{
    if (exc == NULL) {
        return; /* the funnel itself failed: its exception stands */
    }
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
}

int
door_check_fork(const char *fn)
{
    if (!cudacore_forked) {
        return 0;
    }
    if (forked_error == NULL) {
        PyErr_Format(PyExc_RuntimeError, "%s: this process was forked after cudacore was loaded; use spawn", fn);
        return -1;
    }
    raise_instance(PyObject_CallFunction(forked_error, "si", fn, (int)cudacore_fork_driver));
    return -1;
}

int
door_enter(const char *fn, Py_ssize_t nargs, Py_ssize_t want)
{
    if (door_check_fork(fn) < 0) {
        return -1;
    }
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s() takes exactly %zd argument%s (%zd given)", fn, want,
                     want == 1 ? "" : "s", nargs);
        return -1;
    }
    return 0;
}

PyObject *
door_raise(char *wire)
{
    PyObject *text = PyUnicode_DecodeUTF8(wire, (Py_ssize_t)strlen(wire), "replace");
    free(wire);
    if (text == NULL) {
        return NULL;
    }
    if (from_wire == NULL) {
        PyErr_SetObject(PyExc_RuntimeError, text);
        Py_DECREF(text);
        return NULL;
    }
    PyObject *typed = PyObject_CallOneArg(from_wire, text);
    if (typed == Py_None) { /* not in the wire format (never from the facade's guard): raise it as it is */
        Py_DECREF(typed);
        PyErr_SetObject(PyExc_RuntimeError, text);
        Py_DECREF(text);
        return NULL;
    }
    Py_DECREF(text);
    raise_instance(typed);
    return NULL;
}

PyObject *
door_closed(const char *what, const char *op)
{
    if (closed_error == NULL) {
        PyErr_Format(PyExc_ValueError, "this %s is closed", what);
        return NULL;
    }
    raise_instance(PyObject_CallFunction(closed_error, "ss", what, op));
    return NULL;
}

int
door_invalid(const char *fn, const char *arg, const char *detail, PyObject *value)
{
    if (invalid_argument == NULL) {
        PyErr_Format(PyExc_ValueError, "%s: %s %s", fn, arg, detail);
        return -1;
    }
    raise_instance(PyObject_CallFunction(invalid_argument, "sssO", fn, arg, detail, value));
    return -1;
}

int
door_int(PyObject *o, const char *fn, const char *arg, int64_t *out)
{
    if (PyLong_CheckExact(o)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow == 0) {
            if (v == -1 && PyErr_Occurred()) {
                return -1;
            }
            *out = (int64_t)v;
            return 0;
        }
        return door_invalid(fn, arg, "must be an integer in [-2**63, 2**63)", o);
    }
    if (PyBool_Check(o) || !PyIndex_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s(): %s must be an int, not %.100s", fn, arg, Py_TYPE(o)->tp_name);
        return -1;
    }
    PyObject *i = PyNumber_Index(o);
    if (i == NULL) {
        return -1;
    }
    int rc = door_int(i, fn, arg, out);
    Py_DECREF(i);
    return rc;
}

int
door_bool(PyObject *o, const char *fn, const char *arg, int *out)
{
    if (!PyBool_Check(o) && !PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s(): %s must be a bool, not %.100s", fn, arg, Py_TYPE(o)->tp_name);
        return -1;
    }
    int v = PyObject_IsTrue(o);
    if (v < 0) {
        return -1;
    }
    *out = v;
    return 0;
}

int
door_float(PyObject *o, const char *fn, const char *arg, double *out)
{
    if (PyBool_Check(o) || !(PyFloat_Check(o) || PyLong_Check(o))) {
        PyErr_Format(PyExc_TypeError, "%s(): %s must be a float, not %.100s", fn, arg, Py_TYPE(o)->tp_name);
        return -1;
    }
    double v = PyFloat_AsDouble(o);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return door_invalid(fn, arg, "must be a finite float", o);
    }
    *out = v;
    return 0;
}

int
door_str(PyObject *o, const char *fn, const char *arg, const char **out)
{
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s(): %s must be a str, not %.100s", fn, arg, Py_TYPE(o)->tp_name);
        return -1;
    }
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(o, &n);
    if (s == NULL) {
        return -1;
    }
    if ((Py_ssize_t)strlen(s) != n) {
        return door_invalid(fn, arg, "must not contain NUL characters", o);
    }
    *out = s;
    return 0;
}

int
door_buffer(PyObject *o, const char *fn, const char *arg, int writable, Py_buffer *view)
{
    if (writable) {
        /* Ask for a writable view first, so that read-only memory gets a clear error of its own. */
        if (PyObject_GetBuffer(o, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) == 0) {
            goto check_format;
        }
        if (PyErr_ExceptionMatches(PyExc_RuntimeError)) {
            return -1; /* a cudacore error (a closed PinnedBuffer) */
        }
        PyErr_Clear();
        if (PyObject_GetBuffer(o, view, PyBUF_C_CONTIGUOUS) == 0) {
            PyBuffer_Release(view); /* readable but not writable */
            return door_invalid(fn, arg, "is read-only; copy into a bytearray, a writable numpy array or a PinnedBuffer", o);
        }
        PyErr_Clear();
    }
    /* PyBUF_FORMAT too, so that an array of Python objects (format "O") is seen and refused: its bytes
     * are PyObject pointers, which must never be copied to or overwritten from a device. */
    if (PyObject_GetBuffer(o, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        if (PyErr_ExceptionMatches(PyExc_RuntimeError)) {
            return -1; /* a cudacore error (a closed PinnedBuffer): it says what is wrong */
        }
        if (PyObject_CheckBuffer(o) &&
            (PyErr_ExceptionMatches(PyExc_BufferError) || PyErr_ExceptionMatches(PyExc_ValueError))) {
            PyErr_Clear(); /* it exports memory, but not as one C-contiguous block */
            return door_invalid(fn, arg, "must be C-contiguous (numpy.ascontiguousarray makes a copy that is)", o);
        }
        if (PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(PyExc_BufferError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "%s(): %s must be a C-contiguous object with the buffer protocol (bytes, bytearray, "
                         "memoryview, numpy array), not %.100s",
                         fn, arg, Py_TYPE(o)->tp_name);
        }
        return -1;
    }
check_format:
    if (view->format != NULL && strchr(view->format, 'O') != NULL) {
        PyBuffer_Release(view);
        return door_invalid(fn, arg, "holds Python objects (dtype=object), whose bytes are pointers; copy numbers instead", o);
    }
    return 0;
}

PyObject *
door_take_str(char *s)
{
    PyObject *r = PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
    free(s);
    return r;
}

PyObject *
door_translate(void)
{
    if (from_wire == NULL) {
        return NULL;
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value == NULL || !PyErr_GivenExceptionMatches(value, PyExc_RuntimeError)) {
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    if (tb != NULL) {
        PyException_SetTraceback(value, tb);
    }
    PyObject *text = PyObject_Str(value);
    PyObject *typed = text != NULL ? PyObject_CallOneArg(from_wire, text) : NULL;
    Py_XDECREF(text);
    if (typed == NULL) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return NULL;
    }
    if (typed == Py_None) { /* not wire-format text: the original stands */
        Py_DECREF(typed);
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    PyException_SetCause(typed, value); /* steals value */
    PyErr_SetObject((PyObject *)Py_TYPE(typed), typed);
    Py_DECREF(typed);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return NULL;
}
