/*
 * The C method descriptors install_methods() puts on Stream, Event, Graph and Kernel in place of their
 * Python methods: each takes the direct path when it may and otherwise calls the Python function it
 * replaced (see the comment below).
 */
#include "fast.h"

/* ---------------------------------------------------------------------------------------------------- */
/* Hot methods of the Python classes                                                                     */
/*
 * Stream.synchronize and query, Event.synchronize and query, Graph.launch and Kernel.launch are the inner
 * calls of copy, replay and launch loops, where a Python frame costs a noticeable share of the call. install_methods() replaces
 * each of them on its class with a method descriptor of a C function here. That function makes the call on
 * the direct path when it may (the same conditions as every direct call: direct.h), and otherwise calls the
 * Python function it replaced, so every check, error and wait beyond the direct case stays the Python
 * layer's. The Python definitions stay in the source: they are what readers, type checkers and help() see,
 * and what runs whenever C does not take the call.
 */

/* How long a direct wait queries with the GIL held before it hands the wait to the Python method, which
 * waits in GIL-released, interruptible slices through Go. Most synchronizes follow copies and launches of
 * a few microseconds to a few tens; a wait this short delays other threads no more than any GIL-held driver
 * call does, and querying from C reacts within one query of the work's end. */
#define DIRECT_SPIN_NS 20000

static slot_layout event_slots; /* _handle, _device */

/* The handle of an Event of the exact class that the direct path may query, with its device's ordinal in
 * *device; 0 when the query must go through Go. Event.close() clears _handle, with the GIL held, before it
 * destroys the event. Never sets an exception. */
static uint64_t
direct_event(PyObject *event, int64_t *device)
{
    if (cc_snapshot_capturing() || cudacore_forked) {
        return 0;
    }
    *device = ordinal_in(&event_slots, event, 1);
    int64_t handle = int_of(slot_of(&event_slots, event, 0));
    return handle > 0 && *device >= 0 && direct_enabled(*device) ? (uint64_t)handle : 0;
}

/* The handle of a Stream the direct path may query or wait on (direct_stream), with its device's ordinal
 * in *device; 0 when not. */
static uint64_t
direct_own_stream(PyObject *stream, int64_t *device)
{
    *device = ordinal_in(&stream_slots, stream, S_DEVICE);
    return *device >= 0 && !cudacore_forked ? direct_stream(stream, *device) : 0;
}

static int64_t
monotonic_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Query until the work is done, for at most DIRECT_SPIN_NS: 1 done, 0 still running, -1 not taken. */
static int
direct_spin(int (*query)(int64_t, uint64_t), int64_t device, uint64_t handle)
{
    int64_t start = 0;
    for (;;) {
        int r = query(device, handle);
        if (r != 0) {
            return r;
        }
        int64_t now = monotonic_ns();
        if (start == 0) {
            start = now;
        } else if (now - start >= DIRECT_SPIN_NS) {
            return 0;
        }
    }
}

/* The arguments of a hot method, by position or keyword, into out[0..n) (borrowed; NULL where not given):
 * 0, or -1 when they do not fit names (the Python method then says what is wrong). */
static int
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

/* The hot halves. Each returns its result, or NULL with an exception, or NULL without one: not taken (the
 * Python method runs instead, with the same arguments). */
static PyObject *
hot_stream_synchronize(PyObject *self, PyObject *const *Py_UNUSED(args), Py_ssize_t nargs, PyObject *kwnames)
{
    int64_t device;
    uint64_t h = nargs == 0 && kwnames == NULL ? direct_own_stream(self, &device) : 0;
    if (h != 0 && direct_spin(direct_stream_query, device, h) == 1) {
        Py_RETURN_NONE;
    }
    return NULL;
}

static PyObject *
hot_stream_query(PyObject *self, PyObject *const *Py_UNUSED(args), Py_ssize_t nargs, PyObject *kwnames)
{
    int64_t device;
    uint64_t h = nargs == 0 && kwnames == NULL ? direct_own_stream(self, &device) : 0;
    int r = h != 0 ? direct_stream_query(device, h) : -1;
    return r < 0 ? NULL : PyBool_FromLong(r);
}

static PyObject *
hot_event_synchronize(PyObject *self, PyObject *const *Py_UNUSED(args), Py_ssize_t nargs, PyObject *kwnames)
{
    int64_t device;
    uint64_t h = nargs == 0 && kwnames == NULL ? direct_event(self, &device) : 0;
    if (h != 0 && direct_spin(direct_event_query, device, h) == 1) {
        Py_RETURN_NONE;
    }
    return NULL;
}

static PyObject *
hot_event_query(PyObject *self, PyObject *const *Py_UNUSED(args), Py_ssize_t nargs, PyObject *kwnames)
{
    int64_t device;
    uint64_t h = nargs == 0 && kwnames == NULL ? direct_event(self, &device) : 0;
    int r = h != 0 ? direct_event_query(device, h) : -1;
    return r < 0 ? NULL : PyBool_FromLong(r);
}

static PyObject *
hot_graph_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"stream"};
    PyObject *stream;
    if (hot_args(args, nargs, kwnames, names, 1, &stream) == 0 && graph_direct(self, stream)) {
        Py_RETURN_NONE;
    }
    return NULL;
}

/* launch(grid, block, args, shared_mem, stream) with an int grid and block, an int shared_mem and a Stream. */
static PyObject *
hot_kernel_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"grid", "block", "args", "shared_mem", "stream"};
    PyObject *a[5];
    if (hot_args(args, nargs, kwnames, names, 5, a) < 0 || a[0] == NULL || a[1] == NULL || a[2] == NULL) {
        return NULL;
    }
    int64_t grid = int_of(a[0]), block = int_of(a[1]), shared = a[3] == NULL ? 0 : int_of(a[3]);
    if (grid < 1 || block < 1 || shared < 0) {
        return NULL;
    }
    const int64_t v[7] = {grid, 1, 1, block, 1, 1, shared};
    int r = kernel_direct(self, v, a[4], a[2]);
    return r < 0 ? NULL : r == 1 ? Py_NewRef(Py_None) : NULL;
}

typedef struct {
    int cls;             /* which class of install_methods' arguments: 0 Stream, 1 Event, 2 Graph, 3 Kernel */
    const char *name;    /* the method's name on it */
    const char *sig;     /* its text signature, for inspect.signature and help() */
    PyObject *(*hot)(PyObject *, PyObject *const *, Py_ssize_t, PyObject *);
    PyObject *fallback;  /* the Python function it replaced; set by install_methods */
} hot_method;

enum {
    HOT_STREAM_SYNCHRONIZE,
    HOT_STREAM_QUERY,
    HOT_EVENT_SYNCHRONIZE,
    HOT_EVENT_QUERY,
    HOT_GRAPH_LAUNCH,
    HOT_KERNEL_LAUNCH,
    HOT_N
};

static hot_method hot_methods[HOT_N] = {
    [HOT_STREAM_SYNCHRONIZE] = {0, "synchronize", "($self, /)", hot_stream_synchronize, NULL},
    [HOT_STREAM_QUERY] = {0, "query", "($self, /)", hot_stream_query, NULL},
    [HOT_EVENT_SYNCHRONIZE] = {1, "synchronize", "($self, /)", hot_event_synchronize, NULL},
    [HOT_EVENT_QUERY] = {1, "query", "($self, /)", hot_event_query, NULL},
    [HOT_GRAPH_LAUNCH] = {2, "launch", "($self, /, stream=None)", hot_graph_launch, NULL},
    [HOT_KERNEL_LAUNCH] = {3, "launch", "($self, /, grid=1, block=1, args=(), shared_mem=0, stream=None)",
                           hot_kernel_launch, NULL},
};

/* Call method i: its hot half, then, if that did not take the call, the Python function with self and the
 * arguments as given. */
static PyObject *
hot_dispatch(int i, PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *r = hot_methods[i].hot(self, args, nargs, kwnames);
    if (r != NULL || PyErr_Occurred()) {
        return r;
    }
    Py_ssize_t total = nargs + (kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *small[8];
    PyObject **stack = total < 8 ? small : PyMem_Malloc((size_t)(total + 1) * sizeof(PyObject *));
    if (stack == NULL) {
        return PyErr_NoMemory();
    }
    stack[0] = self;
    memcpy(stack + 1, args, (size_t)total * sizeof(PyObject *));
    r = PyObject_Vectorcall(hot_methods[i].fallback, stack, (size_t)(nargs + 1), kwnames);
    if (stack != small) {
        PyMem_Free(stack);
    }
    return r;
}

#define HOT_ENTRY(I, NAME)                                                                                     \
    static PyObject *NAME(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)        \
    {                                                                                                          \
        return hot_dispatch(I, self, args, nargs, kwnames);                                                    \
    }
HOT_ENTRY(HOT_STREAM_SYNCHRONIZE, entry_stream_synchronize)
HOT_ENTRY(HOT_STREAM_QUERY, entry_stream_query)
HOT_ENTRY(HOT_EVENT_SYNCHRONIZE, entry_event_synchronize)
HOT_ENTRY(HOT_EVENT_QUERY, entry_event_query)
HOT_ENTRY(HOT_GRAPH_LAUNCH, entry_graph_launch)
HOT_ENTRY(HOT_KERNEL_LAUNCH, entry_kernel_launch)
#undef HOT_ENTRY

static PyCFunctionWithKeywords hot_entries[HOT_N] = {
    [HOT_STREAM_SYNCHRONIZE] = (PyCFunctionWithKeywords)(void (*)(void))entry_stream_synchronize,
    [HOT_STREAM_QUERY] = (PyCFunctionWithKeywords)(void (*)(void))entry_stream_query,
    [HOT_EVENT_SYNCHRONIZE] = (PyCFunctionWithKeywords)(void (*)(void))entry_event_synchronize,
    [HOT_EVENT_QUERY] = (PyCFunctionWithKeywords)(void (*)(void))entry_event_query,
    [HOT_GRAPH_LAUNCH] = (PyCFunctionWithKeywords)(void (*)(void))entry_graph_launch,
    [HOT_KERNEL_LAUNCH] = (PyCFunctionWithKeywords)(void (*)(void))entry_kernel_launch,
};

PyDoc_STRVAR(install_methods_doc,
             "install_methods(Stream, Event, Graph, Kernel) -> None\n\n"
             "Replace Stream.synchronize and query, Event.synchronize and query, Graph.launch and Kernel.launch with method "
             "descriptors that make the call on the direct path when they may and call the replaced Python "
             "method otherwise. Once per process: a second call changes nothing.");

static PyObject *
fast_install_methods(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    static const char *const event_names[] = {"_handle", "_device"};
    if (nargs != 4 || !PyType_Check(args[0]) || !PyType_Check(args[1]) || !PyType_Check(args[2]) ||
        !PyType_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "install_methods(Stream, Event, Graph, Kernel)");
        return NULL;
    }
    if (hot_methods[0].fallback != NULL) {
        Py_RETURN_NONE;
    }
    if (layout_of(&event_slots, args[1], event_names, 2) < 0) {
        return NULL;
    }
    /* Check everything before changing anything: each name must be a plain Python function of its class. */
    PyObject *fns[HOT_N];
    for (int i = 0; i < HOT_N; i++) {
        PyObject *dict = ((PyTypeObject *)args[hot_methods[i].cls])->tp_dict;
        fns[i] = PyDict_GetItemString(dict, hot_methods[i].name); /* borrowed */
        if (fns[i] == NULL || !PyFunction_Check(fns[i])) {
            PyErr_Format(PyExc_TypeError, "install_methods: %s.%s is not a Python function",
                         ((PyTypeObject *)args[hot_methods[i].cls])->tp_name, hot_methods[i].name);
            return NULL;
        }
    }
    for (int i = 0; i < HOT_N; i++) {
        /* The descriptor keeps its PyMethodDef for good: made once per process, never freed. */
        PyObject *doc = PyObject_GetAttrString(fns[i], "__doc__");
        const char *text = doc != NULL && PyUnicode_Check(doc) ? PyUnicode_AsUTF8(doc) : "";
        PyErr_Clear();
        size_t n = strlen(hot_methods[i].name) + strlen(hot_methods[i].sig) + strlen(text != NULL ? text : "") + 8;
        char *ml_doc = PyMem_RawMalloc(n);
        PyMethodDef *def = PyMem_RawCalloc(1, sizeof *def);
        if (ml_doc == NULL || def == NULL) {
            Py_XDECREF(doc);
            PyMem_RawFree(ml_doc);
            PyMem_RawFree(def);
            return PyErr_NoMemory();
        }
        snprintf(ml_doc, n, "%s%s\n--\n\n%s", hot_methods[i].name, hot_methods[i].sig, text != NULL ? text : "");
        Py_XDECREF(doc);
        def->ml_name = hot_methods[i].name;
        def->ml_meth = (PyCFunction)(void (*)(void))hot_entries[i];
        def->ml_flags = METH_FASTCALL | METH_KEYWORDS;
        def->ml_doc = ml_doc;
        PyObject *cls = args[hot_methods[i].cls];
        PyObject *descr = PyDescr_NewMethod((PyTypeObject *)cls, def);
        if (descr == NULL) {
            return NULL;
        }
        hot_methods[i].fallback = Py_NewRef(fns[i]);
        int rc = PyObject_SetAttrString(cls, hot_methods[i].name, descr);
        Py_DECREF(descr);
        if (rc < 0) {
            return NULL;
        }
    }
    Py_RETURN_NONE;
}

/* The module functions of this file, added to cudacore._fast at init (fast.c). */
PyMethodDef cc_hot_functions[] = {
    {"install_methods", (PyCFunction)(void (*)(void))fast_install_methods, METH_FASTCALL, install_methods_doc},
    {NULL, NULL, 0, NULL},
};
