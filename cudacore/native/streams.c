/*
 * Stream arguments resolved in C (None under `with s:`, a cudacore Stream, a handle; everything else goes
 * to cudacore._handles.stream_handle), read where the Python layer keeps each thread's current streams, and
 * the __slots__ layouts through which the direct path reads Stream, Device, Graph, Kernel and Module
 * objects without an attribute lookup.
 */
#include "fast.h"

/* The __slots__ layouts the direct path reads (fast.h), recorded by configure_slots() and, for Event, by
 * install_methods(). */
slot_layout stream_slots;     /* _owned, _closed, _handle, _device */
slot_layout device_slots;     /* _ordinal */
slot_layout graph_slots;      /* _exec, _device */
slot_layout kernel_slots;     /* _direct, _module, _spec */
slot_layout module_slots;     /* _loaded, _device */
slot_layout kernel_arg_slots; /* KernelArg: _code, _raw */

PyObject *handles_dict;
PyObject *stream_resolver;
PyObject *capture_noter;
PyObject *str_open_blocks;

/* Record the layout of class type for the names given: 0, or -1 with an exception (a name that is not a
 * __slots__ member of type). */
int
layout_of(slot_layout *l, PyObject *type, const char *const *names, int n)
{
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "configure_slots() takes classes");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        PyObject *d = PyObject_GetAttrString(type, names[i]);
        if (d == NULL) {
            return -1;
        }
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type) && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
        Py_ssize_t off = ok ? ((PyMemberDescrObject *)d)->d_member->offset : 0;
        Py_DECREF(d);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a __slots__ member", ((PyTypeObject *)type)->tp_name, names[i]);
            return -1;
        }
        l->offsets[i] = off;
    }
    Py_XSETREF(l->type, (PyTypeObject *)Py_NewRef(type));
    return 0;
}

/* The handle of a cudacore Stream the direct path may use for work of device `device`, or 0 when the work
 * must go through Go: the Stream must be of the exact class, own its driver stream (its close() marks it
 * closed, with the GIL held, before destroying it), be open, be of the device, and no stream of cudacore may
 * capture (a capture's rules and bookkeeping live in Go). The caller holds the GIL until the driver has the
 * call. Never sets an exception. */
uint64_t
direct_stream(PyObject *stream, int64_t device)
{
    if (cc_snapshot_capturing() || !direct_enabled(device) ||
        slot_of(&stream_slots, stream, S_OWNED) != Py_True || slot_of(&stream_slots, stream, S_CLOSED) != Py_False ||
        ordinal_in(&stream_slots, stream, S_DEVICE) != device) {
        return 0;
    }
    int64_t handle = int_of(slot_of(&stream_slots, stream, S_HANDLE));
    return handle > 0 ? (uint64_t)handle : 0;
}

/* The handle of stream, a cudacore Stream (of the exact class) of device `device`, for a call through Go,
 * which checks it is alive; -1 for anything else (the general path decides). Never sets an exception. */
int64_t
stream_handle_on(PyObject *stream, int64_t device)
{
    if (ordinal_in(&stream_slots, stream, S_DEVICE) != device) {
        return -1;
    }
    return int_of(slot_of(&stream_slots, stream, S_HANDLE));
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
            int64_t h = slot_of(&stream_slots, cur, S_CLOSED) == Py_False ? int_of(slot_of(&stream_slots, cur, S_HANDLE)) : -1;
            *owned = h > 0 && slot_of(&stream_slots, cur, S_OWNED) == Py_True;
            Py_DECREF(cur);
            if (h >= 0) {
                *out = h;
                return 0;
            }
        }
    } else if (slot_of(&stream_slots, stream, S_HANDLE) != NULL) {
        *owned = slot_of(&stream_slots, stream, S_OWNED) == Py_True && slot_of(&stream_slots, stream, S_CLOSED) == Py_False;
        return door_int(slot_of(&stream_slots, stream, S_HANDLE), fn, "stream", out);
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

PyDoc_STRVAR(configure_slots_doc, "configure_slots(Stream, Device, Graph, Kernel, Module, KernelArg) -> None\n\n"
                                  "Record where the direct path reads the __slots__ it checks on instances of "
                                  "these exact classes.");

static PyObject *
fast_configure_slots(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    static const char *const stream_names[] = {"_owned", "_closed", "_handle", "_device"};
    static const char *const device_names[] = {"_ordinal"};
    static const char *const graph_names[] = {"_exec", "_device"};
    static const char *const kernel_names[] = {"_direct", "_module", "_spec"};
    static const char *const module_names[] = {"_loaded", "_device"};
    static const char *const kernel_arg_names[] = {"_code", "_raw"};
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "configure_slots(Stream, Device, Graph, Kernel, Module, KernelArg)");
        return NULL;
    }
    if (layout_of(&stream_slots, args[0], stream_names, 4) < 0 || layout_of(&device_slots, args[1], device_names, 1) < 0 ||
        layout_of(&graph_slots, args[2], graph_names, 2) < 0 || layout_of(&kernel_slots, args[3], kernel_names, 3) < 0 ||
        layout_of(&module_slots, args[4], module_names, 2) < 0 || layout_of(&kernel_arg_slots, args[5], kernel_arg_names, 2) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
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
    {"configure_slots", (PyCFunction)(void (*)(void))fast_configure_slots, METH_FASTCALL, configure_slots_doc},
    {"configure_streams", (PyCFunction)(void (*)(void))fast_configure_streams, METH_FASTCALL,
     configure_streams_doc},
    {"thread_streams", (PyCFunction)fast_thread_streams, METH_NOARGS, thread_streams_doc},
    {NULL, NULL, 0, NULL},
};
