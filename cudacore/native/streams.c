/*
 * Stream arguments resolved in C (None under `with s:`, a cudacore Stream, a handle; everything else goes
 * to cudacore._handles.stream_handle), read where the Python layer keeps each thread's current streams.
 */
#include "fast.h"

PyObject *handles_dict;
PyObject *stream_resolver;
PyObject *capture_noter;
PyObject *str_open_blocks;

/* The handle of a cudacore Stream the direct path may use for work of device `device`, or 0 when the work
 * must go through Go: the Stream must own its driver stream (its close() marks it
 * closed, with the GIL held, before destroying it), be open, be of the device, and no stream of cudacore may
 * capture (a capture's rules and bookkeeping live in Go). The caller holds the GIL until the driver has the
 * call. Never sets an exception. */
uint64_t
direct_stream(PyObject *stream, int64_t device)
{
    if (!PyObject_TypeCheck(stream, &StreamType)) {
        return 0;
    }
    const StreamObject *s = (const StreamObject *)stream;
    if (cc_snapshot_capturing() || !direct_enabled(device) || !s->owned || s->closed || ordinal_of(s->device) != device) {
        return 0;
    }
    return s->handle > 0 ? (uint64_t)s->handle : 0;
}

/* The handle of stream, a cudacore Stream of device `device`, for a call through Go, which checks it is
 * alive; -1 for anything else (the general path decides). Never sets an exception. */
int64_t
stream_handle_on(PyObject *stream, int64_t device)
{
    if (!PyObject_TypeCheck(stream, &StreamType) || ordinal_of(((StreamObject *)stream)->device) != device) {
        return -1;
    }
    return ((StreamObject *)stream)->handle >= 0 ? ((StreamObject *)stream)->handle : -1;
}

/* Whether stream=None means the synchronous copy on the legacy stream: no `with stream:` block is open
 * anywhere (cudacore._handles.open_stream_blocks is 0). */
int
no_stream_blocks(void)
{
    if (handles_dict == NULL) {
        return 0;
    }
    PyObject *n = PyDict_GetItemWithError(handles_dict, str_open_blocks); /* borrowed */
    if (n == NULL) {
        PyErr_Clear();
        return 0;
    }
    return PyLong_CheckExact(n) && PyLong_AsLong(n) == 0;
}

/* The handle of a stream argument (a Stream, an int handle, or None: the current stream of device), as
 * cudacore._handles.stream_handle gives it, and whether it names an open Stream this process owns
 * (*owned). The common cases (None, a Stream, a non-negative int) cost no Python frame; everything else,
 * errors included, is stream_handle's. 0, or -1 with an exception set. */
int
resolve_stream(PyObject *stream, int64_t device, const char *fn, int64_t *out, int *owned)
{
    *owned = 0;
    if (stream == Py_None && handles_dict != NULL) {
        PyObject *n = PyDict_GetItemWithError(handles_dict, str_open_blocks); /* borrowed */
        if (n == NULL && PyErr_Occurred()) {
            return -1;
        }
        if (n == NULL || (PyLong_CheckExact(n) && PyLong_AsLong(n) == 0)) {
            *out = 0;
            return 0;
        }
        /* A `with stream:` block is open somewhere: this thread's current Stream of the device, read where
         * cudacore._handles keeps it; a closed one (or none readable) goes to the resolver, which explains. */
        PyObject *cur = current_stream_object(device);
        if (cur == NULL && PyErr_Occurred()) {
            return -1;
        }
        if (cur == Py_None) {
            Py_DECREF(cur);
            *out = 0;
            return 0;
        }
        if (cur != NULL) {
            const StreamObject *s = PyObject_TypeCheck(cur, &StreamType) ? (const StreamObject *)cur : NULL;
            int64_t h = s != NULL && !s->closed && s->handle >= 0 ? s->handle : -1;
            *owned = h > 0 && s->owned;
            Py_DECREF(cur);
            if (h >= 0) {
                *out = h;
                return 0;
            }
        }
    } else if (PyObject_TypeCheck(stream, &StreamType)) {
        const StreamObject *s = (const StreamObject *)stream;
        *owned = s->owned && !s->closed;
        *out = s->handle;
        return 0;
    } else if (PyLong_CheckExact(stream)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(stream, &overflow);
        if (overflow == 0 && v >= 0) {
            *out = v;
            return 0;
        }
        PyErr_Clear(); /* the resolver names the argument and its range */
    }
    if (stream_resolver == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cudacore._fast is not configured");
        return -1;
    }
    PyObject *args[2] = {stream, NULL};
    args[1] = PyLong_FromLongLong(device);
    if (args[1] == NULL) {
        return -1;
    }
    PyObject *h = PyObject_Vectorcall(stream_resolver, args, 2, NULL);
    Py_DECREF(args[1]);
    if (h == NULL) {
        return -1;
    }
    int r = door_int(h, fn, "stream", out);
    Py_DECREF(h);
    return r;
}

/* The key of this thread's current streams in its thread-state dict (PyThreadState_GetDict). */
static PyObject *str_thread_streams;

/* This thread's current streams (device ordinal -> Stream; absent: the legacy default stream), the one
 * copy there is: cudacore._handles reads and changes it through fast.thread_streams(). It lives in the
 * thread's state dict, which the interpreter gives each thread and drops when the thread ends, so the
 * hot paths find it without a thread-local's lookup. A borrowed reference; NULL when the thread has none
 * yet and create is 0 (no exception), or on an error (exception set). */
static PyObject *
thread_streams(int create)
{
    PyObject *tsd = PyThreadState_GetDict(); /* borrowed; the GIL is held */
    if (tsd == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_RuntimeError, "cudacore: no thread state dict");
        }
        return NULL;
    }
    if (str_thread_streams == NULL && (str_thread_streams = PyUnicode_InternFromString("cudacore.current_streams")) == NULL) {
        return NULL;
    }
    PyObject *d = PyDict_GetItemWithError(tsd, str_thread_streams); /* borrowed */
    if (d != NULL || PyErr_Occurred() || !create) {
        return d;
    }
    d = PyDict_New();
    if (d == NULL || PyDict_SetItem(tsd, str_thread_streams, d) < 0) {
        Py_XDECREF(d);
        return NULL;
    }
    Py_DECREF(d); /* the thread-state dict holds it */
    return d;
}

/* This thread's current stream of device `device` (thread_streams): a new reference to the Stream,
 * Py_None for the legacy default stream, or NULL on an error (exception set). Runs no Python code. */
PyObject *
current_stream_object(int64_t device)
{
    PyObject *streams = thread_streams(0);
    if (streams == NULL) {
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    }
    PyObject *key = PyLong_FromLongLong(device);
    if (key == NULL) {
        return NULL;
    }
    PyObject *cur = PyDict_GetItemWithError(streams, key); /* borrowed */
    Py_DECREF(key);
    return cur != NULL ? Py_NewRef(cur) : PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
}

PyDoc_STRVAR(thread_streams_doc, "thread_streams() -> dict\n\n"
                                 "This thread's current streams, device ordinal -> Stream (absent: the legacy default "
                                 "stream): the one copy, kept in the thread's state dict, that cudacore._handles changes "
                                 "and the hot paths read.");

static PyObject *
fast_thread_streams(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    return Py_XNewRef(thread_streams(1));
}

/* The stream a call with stream=None works on, for the direct path: this thread's current Stream of the
 * device while a `with stream:` block is open anywhere, else NULL (the legacy default stream, which the
 * direct path does not take). A new reference, or NULL; never sets an exception. */
PyObject *
current_for_direct(int64_t device)
{
    if (no_stream_blocks()) {
        return NULL;
    }
    PyObject *cur = current_stream_object(device);
    if (cur == NULL) {
        PyErr_Clear();
        return NULL;
    }
    if (cur == Py_None) {
        Py_DECREF(cur);
        return NULL;
    }
    return cur;
}

PyDoc_STRVAR(configure_streams_doc,
             "configure_streams(handles_dict, stream_handle, note_capture_buffers) -> None\n\n"
             "Register what the hot methods resolve stream arguments with: cudacore._handles' module dict (its "
             "open_stream_blocks count), its stream_handle function (every case but the common ones), and "
             "the function new buffers go to while a capture is registered (the snapshot's count).");

static PyObject *
fast_configure_streams(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyDict_Check(args[0]) || !PyCallable_Check(args[1]) || !PyCallable_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "configure_streams(handles_dict: dict, stream_handle, note)");
        return NULL;
    }
    if (str_open_blocks == NULL && (str_open_blocks = PyUnicode_InternFromString("open_stream_blocks")) == NULL) {
        return NULL;
    }
    Py_XSETREF(handles_dict, Py_NewRef(args[0]));
    Py_XSETREF(stream_resolver, Py_NewRef(args[1]));
    Py_XSETREF(capture_noter, Py_NewRef(args[2]));
    Py_RETURN_NONE;
}

/* The module functions of this file, added to cudacore._fast at init (fast.c). */
PyMethodDef cc_streams_functions[] = {
    {"configure_streams", (PyCFunction)(void (*)(void))fast_configure_streams, METH_FASTCALL,
     configure_streams_doc},
    {"thread_streams", (PyCFunction)fast_thread_streams, METH_NOARGS, thread_streams_doc},
    {NULL, NULL, 0, NULL},
};
