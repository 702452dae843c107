/*
 * Graph's C base (cudacore._fast.Graph): the device and the executable graph the direct path launches, and
 * the hot method launch. python/cudacore/_stream.py subclasses it; its destroy() clears the executable
 * graph, with the GIL held, before Go destroys it. The general path of launch is the subclass's _launch,
 * with the same signature.
 */
#include "fast.h"

static int
graph_traverse(GraphObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->device);
    return 0;
}

static int
graph_clear(GraphObject *self)
{
    Py_CLEAR(self->device);
    return 0;
}

static void
graph_dealloc(GraphObject *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    graph_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
graph_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"stream"};
    PyObject *stream;
    if (hot_args(args, nargs, kwnames, names, 1, &stream) == 0 && graph_direct(self, stream)) {
        Py_RETURN_NONE;
    }
    GENERAL_NAME(name, "_launch");
    return call_general(self, name, args, nargs, kwnames);
}

PyDoc_STRVAR(graph_launch_doc,
             "launch($self, /, stream=None)\n--\n\n"
             "Launch the graph on ``stream`` (None: the current stream of the graph's device). It does not wait.");

static PyMethodDef graph_methods[] = {
    {"launch", (PyCFunction)(void (*)(void))graph_launch, METH_FASTCALL | METH_KEYWORDS, graph_launch_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef graph_members[] = {
    {"_device", T_OBJECT_EX, offsetof(GraphObject, device), 0, "The graph's Device."},
    {"_exec", T_LONGLONG, offsetof(GraphObject, exec), 0,
     "The executable graph the direct path may launch (0: launch through Go)."},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject GraphType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudacore._fast.Graph",
    .tp_basicsize = sizeof(GraphObject),
    .tp_dealloc = (destructor)graph_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The fields and hot method of a CUDA graph (subclassed by cudacore.Graph).",
    .tp_traverse = (traverseproc)graph_traverse,
    .tp_clear = (inquiry)graph_clear,
    .tp_weaklistoffset = offsetof(GraphObject, weakreflist),
    .tp_methods = graph_methods,
    .tp_members = graph_members,
};
