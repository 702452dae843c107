/*
 * Kernel and graph launches: arguments packed in C (Python numbers, numpy scalars, typed KernelArgs,
 * Buffers, pointers, CUDA Array Interface objects) by the kernel's argument codes, then the launch on the
 * direct path when it may, else through the Launch door into Go.
 */
#include "fast.h"

/* Graph.launch on the direct path (see graph_launch_direct_doc): 1 launched, 0 not taken. Never sets an
 * exception. */
int
graph_direct(PyObject *graph, PyObject *stream)
{
    if (!PyObject_TypeCheck(graph, &GraphType)) {
        return 0;
    }
    int64_t exec = ((GraphObject *)graph)->exec;
    int64_t device = ordinal_of(((GraphObject *)graph)->device);
    if (exec <= 0 || device < 0 || cudacore_forked) {
        return 0;
    }
    PyObject *cur = stream == NULL || stream == Py_None ? current_for_direct(device) : Py_NewRef(stream);
    if (cur == NULL) {
        return 0;
    }
    /* From here to the driver's call no Python code runs: the checks hold until the launch. The executable
     * graph is read again: finding the current stream may have run Python code (a thread's first use of
     * cudacore._handles' thread-local), which may have destroyed the graph. */
    uint64_t handle = ((GraphObject *)graph)->exec == exec ? direct_stream(cur, device) : 0;
    int r = handle != 0 && direct_graph_launch(device, (uint64_t)exec, handle);
    Py_DECREF(cur);
    return r;
}

PyDoc_STRVAR(graph_launch_direct_doc, "graph_launch_direct(graph, stream) -> bool\n\n"
                                      "Graph.launch on the direct path: launch graph._exec, the executable graph "
                                      "that GraphLaunch handed out, on stream from C. The checks (direct_stream) and "
                                      "the driver call happen with the GIL held throughout, so no other thread can "
                                      "close the stream or destroy the graph in between. False when not taken: the "
                                      "caller launches through Go, which checks and reports.");

static PyObject *
fast_graph_launch_direct(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (door_enter("graph_launch", nargs, 2) < 0) {
        return NULL;
    }
    return PyBool_FromLong(graph_direct(args[0], args[1]));
}

PyDoc_STRVAR(launch_doc, "launch(function: int, gx, gy, gz, bx, by, bz, shared_mem, stream, args, spec) -> int\n\n"
                         "Kernel.launch's hot path: pack args by spec (3 bytes a parameter: kind code, size, "
                         "flags 1=float 2=takes a Buffer) and launch through the FunctionLaunch door, returning what "
                         "it returns. Python numbers, numpy scalars, typed values (cudacore.int32(...)) and Buffers pack in C; "
                         "returns NotImplemented, having done nothing, when an argument needs the general path (bytes, "
                         "an object with __cuda_array_interface__, a value out of range, a wrong count).");

enum { LAUNCH_FLOAT = 1, LAUNCH_BUFFER = 2, LAUNCH_MAX_PACKED = 1024 };

/* A number read from a numpy scalar (or a 0-d numpy array). */
typedef struct {
    enum { NUM_SIGNED, NUM_UNSIGNED, NUM_FLOAT } kind;
    long long i;
    unsigned long long u;
    double f;
} number;

/* Read a as a numpy number: numpy's own scalar types (and 0-d arrays) are static C types named
 * "numpy.*", whose buffer export is numpy's C code, so reading one runs no Python code (the direct path
 * holds the GIL from its checks to the driver's call). 1 read, 0 not one (no exception set). */
static int
numpy_number(PyObject *a, number *n)
{
    PyTypeObject *t = Py_TYPE(a);
    if ((t->tp_flags & Py_TPFLAGS_HEAPTYPE) != 0 || strncmp(t->tp_name, "numpy.", 6) != 0 || !PyObject_CheckBuffer(a)) {
        return 0;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(a, &view, PyBUF_ND | PyBUF_FORMAT) < 0) { /* ND: the true ndim (else 0) */
        PyErr_Clear();
        return 0;
    }
    int ok = 0;
    const char *f = view.format;
    if (view.ndim == 0 && f != NULL) {
        if (*f == '@' || *f == '=' || *f == '<') { /* native order on the little-endian hosts cudacore runs on */
            f++;
        }
        if (f[0] != '\0' && f[1] == '\0') {
            ok = 1;
            switch (f[0]) {
            case 'b': n->kind = NUM_SIGNED, n->i = *(const signed char *)view.buf; break;
            case 'h': n->kind = NUM_SIGNED, n->i = *(const short *)view.buf; break;
            case 'i': n->kind = NUM_SIGNED, n->i = *(const int *)view.buf; break;
            case 'l': n->kind = NUM_SIGNED, n->i = *(const long *)view.buf; break;
            case 'q': n->kind = NUM_SIGNED, n->i = *(const long long *)view.buf; break;
            case 'B': n->kind = NUM_UNSIGNED, n->u = *(const unsigned char *)view.buf; break;
            case 'H': n->kind = NUM_UNSIGNED, n->u = *(const unsigned short *)view.buf; break;
            case 'I': n->kind = NUM_UNSIGNED, n->u = *(const unsigned int *)view.buf; break;
            case 'L': n->kind = NUM_UNSIGNED, n->u = *(const unsigned long *)view.buf; break;
            case 'Q': n->kind = NUM_UNSIGNED, n->u = *(const unsigned long long *)view.buf; break;
            case 'f': n->kind = NUM_FLOAT, n->f = *(const float *)view.buf; break;
            case 'd': n->kind = NUM_FLOAT, n->f = *(const double *)view.buf; break;
            default: ok = 0; /* bool, half, complex, ...: the general path decides */
            }
        }
    }
    PyBuffer_Release(&view);
    return ok;
}

/* Write an integer into a parameter of kind code and size bytes, when it fits: 1, or 0 (nothing
 * written). negative says the value is v as a signed number (else as an unsigned one). */
static int
pack_int(int code, int size, int negative, unsigned long long v, unsigned char *out)
{
    int signed_kind = code == CC_ARG_I8 || code == CC_ARG_I16 || code == CC_ARG_I32 || code == CC_ARG_I64;
    if (signed_kind) {
        unsigned long long bound = 1ULL << (size * 8 - 1); /* |min|; max is bound - 1 */
        if (negative ? (0 - v) > bound : v >= bound) {
            return 0;
        }
    } else if (negative || (size < 8 && v >> (size * 8) != 0)) {
        return 0;
    }
    memcpy(out, &v, (size_t)size); /* little-endian: the low bytes, two's complement for a negative value */
    return 1;
}

/* Pack one argument; 1 packed, 0 needs the general path, -1 error set. */
static int
launch_pack_one(PyObject *a, int code, int size, int flags, unsigned char *out)
{
    number n;
    if (PyObject_TypeCheck(a, &KernelArgType)) {
        /* A typed value (cudacore.int32(...)): checked and encoded when it was made; passed as it is, as the
         * general path passes it, where its size is the parameter's. */
        PyObject *raw = ((KernelArgObject *)a)->raw;
        int64_t c = ((KernelArgObject *)a)->code;
        if (raw == NULL || !PyBytes_CheckExact(raw) || PyBytes_GET_SIZE(raw) != size || c < CC_ARG_I8 || c > CC_ARG_PTR) {
            return 0;
        }
        memcpy(out, PyBytes_AS_STRING(raw), (size_t)size);
        out[-3] = (unsigned char)c;
        return 1;
    }
    if (flags & LAUNCH_FLOAT) {
        double v;
        if (PyFloat_CheckExact(a)) {
            v = PyFloat_AS_DOUBLE(a);
        } else if (PyLong_CheckExact(a)) {
            v = PyLong_AsDouble(a);
            if (v == -1.0 && PyErr_Occurred()) {
                PyErr_Clear();
                return 0;
            }
        } else if (numpy_number(a, &n)) {
            v = n.kind == NUM_FLOAT ? n.f : n.kind == NUM_SIGNED ? (double)n.i : (double)n.u;
        } else {
            return 0;
        }
        if (size == 4) {
            if (isfinite(v) && (v > FLT_MAX || v < -FLT_MAX)) {
                return 0; /* does not fit a float: the general path explains */
            }
            float f = (float)v;
            memcpy(out, &f, 4);
        } else if (size == 8) {
            memcpy(out, &v, 8);
        } else {
            return 0; /* half precision: the general path converts it */
        }
        return 1;
    }
    if (PyLong_CheckExact(a)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(a, &overflow);
        if (overflow == 0 && !(v == -1 && PyErr_Occurred())) {
            return pack_int(code, size, v < 0, (unsigned long long)v, out);
        }
        PyErr_Clear();
        if (overflow > 0) { /* above int64: an unsigned 64-bit value, or out of range */
            unsigned long long u = PyLong_AsUnsignedLongLong(a);
            if (u == (unsigned long long)-1 && PyErr_Occurred()) {
                PyErr_Clear();
                return 0;
            }
            return pack_int(code, size, 0, u, out);
        }
        return 0;
    }
    if (numpy_number(a, &n)) {
        if (n.kind == NUM_FLOAT) {
            return 0; /* a float for an integer parameter: the general path refuses it */
        }
        return n.kind == NUM_SIGNED ? pack_int(code, size, n.i < 0, (unsigned long long)n.i, out)
                                    : pack_int(code, size, 0, n.u, out);
    }
    if ((flags & LAUNCH_BUFFER) && PyObject_TypeCheck(a, &BufferType)) {
        BufferObject *b = (BufferObject *)a;
        if (size != 8) {
            return 0;
        }
        if (buffer_gone(b)) {
            door_closed("Buffer", "cudacore.launch");
            return -1;
        }
        memcpy(out, &b->ptr, 8);
        out[-3] = CC_ARG_PTR;
        return 1;
    }
    return 0;
}

/* The answer for the last type asked whether it is one library's class: kept (the type held) while the
 * type is unchanged. Assigning to a class's attributes, __module__ included, gives it a new version tag (0
 * until the interpreter assigns one, and then the answer is not kept). */
typedef struct {
    PyTypeObject *last;
    unsigned int tag;
    int answer;
} type_memo;

/* Whether type is the class named name of module module, asked once per type (memo). A type of another
 * name is not asked about, nor kept. */
static int
is_library_class(type_memo *memo, PyTypeObject *type, const char *name, const char *module)
{
    if (type == memo->last && memo->tag != 0 && type->tp_version_tag == memo->tag) {
        return memo->answer;
    }
    if (strcmp(type->tp_name, name) != 0) {
        return 0;
    }
    PyObject *mod = PyObject_GetAttrString((PyObject *)type, "__module__");
    int answer = mod != NULL && PyUnicode_Check(mod) && PyUnicode_CompareWithASCIIString(mod, module) == 0;
    Py_XDECREF(mod);
    PyErr_Clear(); /* a type's __module__ is a plain attribute: nothing to lose */
    Py_INCREF(type);
    Py_XSETREF(memo->last, type);
    memo->tag = type->tp_version_tag;
    memo->answer = answer;
    return answer;
}

/* Whether type is CuPy's ndarray (the class users make arrays of: named "ndarray", from module "cupy";
 * numpy's is "numpy.ndarray", another name). */
static int
is_cupy_ndarray(PyTypeObject *type)
{
    static type_memo memo;
    return is_library_class(&memo, type, "ndarray", "cupy");
}

/* After a failed read of an argument's attribute: clear an ordinary error (0: the general path reads the
 * argument again and explains), keep what must not be lost, a KeyboardInterrupt or a MemoryError (-1). */
static int
clear_read_error(void)
{
    if (PyErr_Occurred() == NULL) {
        return 0;
    }
    if (PyErr_ExceptionMatches(PyExc_Exception) && !PyErr_ExceptionMatches(PyExc_MemoryError)) {
        PyErr_Clear();
        return 0;
    }
    return -1;
}

/* The device address of a CuPy array, as its __cuda_array_interface__ gives it (the "data" entry is
 * a.data.ptr, the start of the array, view or not), read without building that dictionary: a new
 * reference to an exact int, or NULL when a is not CuPy's ndarray, is empty (its interface says 0) or the
 * attributes are not as expected (no exception set: the interface decides), or when reading them raised
 * what clear_read_error keeps (the exception set). */
static PyObject *
cupy_array_ptr(PyObject *a)
{
    if (!is_cupy_ndarray(Py_TYPE(a))) {
        return NULL;
    }
    GENERAL_NAME(str_size, "size");
    GENERAL_NAME(str_data, "data");
    GENERAL_NAME(str_ptr, "ptr");
    PyObject *size = PyObject_GetAttr(a, str_size);
    int empty = size == NULL || !PyLong_CheckExact(size) || PyLong_AsLongLong(size) <= 0;
    Py_XDECREF(size);
    PyObject *mem = empty ? NULL : PyObject_GetAttr(a, str_data);
    PyObject *ptr = mem != NULL ? PyObject_GetAttr(mem, str_ptr) : NULL;
    Py_XDECREF(mem);
    if (ptr == NULL || !PyLong_CheckExact(ptr)) {
        Py_XDECREF(ptr);
        clear_read_error();
        return NULL;
    }
    return ptr;
}

/* Whether type is PyTorch's own tensor type, torch.Tensor or torch.nn.Parameter (by name and module; a
 * subclass of a user's may override __torch_function__, through which PyTorch reads the interface, so it
 * goes by the interface). */
static int
is_torch_tensor(PyTypeObject *type)
{
    static type_memo tensor, parameter;
    return is_library_class(&tensor, type, "Tensor", "torch") ||
           is_library_class(&parameter, type, "Parameter", "torch.nn.parameter");
}

/* An attribute of a (name interned) that must be exactly the singleton want (Py_True or Py_False): 1 yes,
 * 0 no or unreadable (the error cleared when it is ordinary), -1 when reading it raised what
 * clear_read_error keeps. */
static int
attr_is(PyObject *a, PyObject *name, PyObject *want)
{
    PyObject *v = PyObject_GetAttr(a, name);
    int yes = v == want;
    Py_XDECREF(v);
    if (v == NULL) {
        return clear_read_error() < 0 ? -1 : 0;
    }
    return yes;
}

/* The device address of a PyTorch tensor as its __cuda_array_interface__ gives it, without building that
 * dictionary (a Python property): the address of its first element, data_ptr(), for a dense CUDA tensor
 * that does not require grad and is not empty (the general path reads it the same way, _torch_pointer). A new reference to an exact int, or NULL with no exception
 * set when a is not such a tensor (the interface decides, and explains what it refuses: a CPU tensor, a
 * sparse one, one that requires grad), or NULL with the exception set when reading it raised what
 * clear_read_error keeps. */
static PyObject *
torch_tensor_ptr(PyObject *a)
{
    if (!is_torch_tensor(Py_TYPE(a))) {
        return NULL;
    }
    GENERAL_NAME(str_is_cuda, "is_cuda");
    GENERAL_NAME(str_is_sparse, "is_sparse");
    GENERAL_NAME(str_requires_grad, "requires_grad");
    GENERAL_NAME(str_numel, "numel");
    GENERAL_NAME(str_data_ptr, "data_ptr");
    int ok = attr_is(a, str_is_cuda, Py_True);
    ok = ok == 1 ? attr_is(a, str_is_sparse, Py_False) : ok;
    ok = ok == 1 ? attr_is(a, str_requires_grad, Py_False) : ok;
    if (ok != 1) {
        return NULL; /* the exception, if any, is kept for the caller */
    }
    PyObject *numel = PyObject_CallMethodNoArgs(a, str_numel);
    int empty = numel == NULL || !PyLong_CheckExact(numel) || PyLong_AsLongLong(numel) <= 0;
    Py_XDECREF(numel);
    PyObject *ptr = empty ? NULL : PyObject_CallMethodNoArgs(a, str_data_ptr);
    if (ptr == NULL || !PyLong_CheckExact(ptr)) {
        Py_XDECREF(ptr);
        clear_read_error();
        return NULL;
    }
    return ptr;
}

/* args with each array of another library passed for a pointer parameter (an object with
 * __cuda_array_interface__: a CuPy array, a Numba device array, a PyTorch tensor) replaced by its device
 * address, as the general path reads it (the "data" entry's address): a new reference, to args itself when
 * nothing was replaced. Reading the attribute can run Python code (a property), so callers resolve the
 * arguments before any check the direct path relies on. An object whose interface cannot be read is left
 * as it is, for the general path to explain. NULL, with the exception set, when Python is out of memory
 * or reading an argument raised what must not be lost (a KeyboardInterrupt: clear_read_error). */
static PyObject *
resolve_array_args(PyObject *args, PyObject *spec)
{
    if ((!PyTuple_CheckExact(args) && !PyList_CheckExact(args)) || !PyBytes_CheckExact(spec) ||
        PySequence_Fast_GET_SIZE(args) * 3 != PyBytes_GET_SIZE(spec)) {
        return Py_NewRef(args);
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(args);
    const unsigned char *sp = (const unsigned char *)PyBytes_AS_STRING(spec);
    PyObject **items = PySequence_Fast_ITEMS(args);
    PyObject *out = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = items[i];
        /* Not a test of the buffer protocol: a CuPy array has a buffer slot (that refuses), and an array is
         * known by its interface, not by what else it offers. bytes and friends (subclasses too) are structs
         * by value, as the general path takes them; numpy scalars are numbers. */
        number num;
        if (!(sp[3 * i + 2] & LAUNCH_BUFFER) || PyLong_CheckExact(a) || PyObject_TypeCheck(a, &BufferType) ||
            PyObject_TypeCheck(a, &KernelArgType) || PyBytes_Check(a) || PyByteArray_Check(a) ||
            PyMemoryView_Check(a) || PyFloat_CheckExact(a) || numpy_number(a, &num)) {
            continue; /* packed as it is, or left to the general path */
        }
        /* A CuPy array's or a PyTorch tensor's address costs no dictionary. */
        PyObject *cai = NULL, *ptr = cupy_array_ptr(a);
        if (ptr == NULL && !PyErr_Occurred()) {
            ptr = torch_tensor_ptr(a);
        }
        if (ptr == NULL && PyErr_Occurred()) {
            Py_XDECREF(out);
            return NULL;
        }
        if (ptr == NULL) {
            cai = PyObject_GetAttrString(a, "__cuda_array_interface__");
            PyObject *data = cai != NULL && PyDict_Check(cai) ? PyDict_GetItemString(cai, "data") : NULL; /* borrowed */
            ptr = data != NULL && PyTuple_Check(data) && PyTuple_GET_SIZE(data) >= 1 ? PyTuple_GET_ITEM(data, 0) : NULL;
            if (ptr == NULL || !PyLong_CheckExact(ptr)) {
                Py_XDECREF(cai);
                if (clear_read_error() < 0) {
                    Py_XDECREF(out);
                    return NULL;
                }
                continue;
            }
            Py_INCREF(ptr); /* owned, as cupy_array_ptr's is */
        }
        if (out == NULL && (out = PyList_New(n)) != NULL) {
            for (Py_ssize_t j = 0; j < n; j++) {
                PyList_SET_ITEM(out, j, Py_NewRef(items[j]));
            }
        }
        if (out == NULL) {
            Py_DECREF(ptr);
            Py_XDECREF(cai);
            return NULL;
        }
        Py_SETREF(PyList_GET_ITEM(out, i), ptr);
        Py_XDECREF(cai);
    }
    return out != NULL ? out : Py_NewRef(args);
}

/* Pack seq by spec into packed (the FunctionLaunch door's format: per argument its kind code, size and a
 * zero byte, then the value). 1 packed (*len set), 0 needs the general path, -1 error set. */
static int
launch_pack(PyObject *seq, PyObject *spec, unsigned char *packed, size_t *len)
{
    if ((!PyTuple_CheckExact(seq) && !PyList_CheckExact(seq)) || !PyBytes_CheckExact(spec)) {
        return 0;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    const unsigned char *sp = (const unsigned char *)PyBytes_AS_STRING(spec);
    if (n * 3 != PyBytes_GET_SIZE(spec) || n * 11 > LAUNCH_MAX_PACKED) {
        return 0;
    }
    size_t off = 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        int code = sp[3 * i], size = sp[3 * i + 1], flags = sp[3 * i + 2];
        if ((size != 1 && size != 2 && size != 4 && size != 8) || code < CC_ARG_I8 || code > CC_ARG_PTR) {
            return 0; /* not a spec Kernel made: the general path decides */
        }
        packed[off] = (unsigned char)code;
        packed[off + 1] = (unsigned char)size;
        packed[off + 2] = 0;
        int r = launch_pack_one(items[i], code, size, flags, packed + off + 3);
        if (r <= 0) {
            return r;
        }
        off += 3 + (size_t)size;
    }
    *len = off;
    return 1;
}

static PyObject *
fast_launch(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    int64_t v[9];
    static const char *names[9] = {"function", "gx", "gy", "gz", "bx", "by", "bz", "shared_mem", "stream"};
    if (door_enter("launch", nargs, 11) < 0) {
        return NULL;
    }
    for (int i = 0; i < 9; i++) {
        if (door_int(args[i], "launch", names[i], &v[i]) < 0) {
            return NULL;
        }
    }
    PyObject *resolved = resolve_array_args(args[9], args[10]);
    if (resolved == NULL) {
        return NULL;
    }
    unsigned char packed[LAUNCH_MAX_PACKED];
    size_t off = 0;
    int r = launch_pack(resolved, args[10], packed, &off);
    Py_DECREF(resolved);
    if (r < 0) {
        return NULL;
    }
    if (r == 0) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    int64_t ret;
    char *err = cudacore_door_FunctionLaunch(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], packed,
                                             (int64_t)off, &ret);
    if (err != NULL) {
        return door_raise(err);
    }
    return PyLong_FromLongLong(ret);
}

PyDoc_STRVAR(launch_direct_doc,
             "launch_direct(kernel, gx, gy, gz, bx, by, bz, shared_mem, stream, args) -> bool\n\n"
             "Kernel.launch on the direct path: pack args by kernel._spec as launch() does and launch "
             "kernel._direct, the driver's function handle that FunctionLaunch handed out, on stream from C. "
             "The checks (the module loaded, direct_stream) and the driver call happen with the GIL held "
             "throughout. False when not taken (an argument needs the general path, no direct path, or the "
             "driver failed): the caller launches through Go, which checks and reports.");

static int kernel_direct_resolved(PyObject *kernel, const int64_t v[7], int64_t fn, PyObject *mod, PyObject *spec,
                                  int64_t device, PyObject *cur, PyObject *resolved);

/* Kernel.launch on the direct path: v holds gx, gy, gz, bx, by, bz and shared_mem. 1 launched, 0 not
 * taken (nothing done: the full path decides and explains), -1 error set. */
int
kernel_direct(PyObject *kernel, const int64_t v[7], PyObject *stream, PyObject *args)
{
    for (int i = 0; i < 6; i++) {
        if (v[i] < 1 || v[i] > UINT32_MAX) {
            return 0;
        }
    }
    if (v[6] < 0 || v[6] > UINT32_MAX || cudacore_forked) {
        return 0;
    }
    if (!PyObject_TypeCheck(kernel, &KernelType)) {
        return 0;
    }
    const KernelObject *k = (const KernelObject *)kernel;
    int64_t fn = k->direct;
    PyObject *mod = k->module;
    PyObject *spec = k->spec;
    if (fn <= 0 || mod == NULL || spec == NULL || !PyObject_TypeCheck(mod, &ModuleType) || !((ModuleObject *)mod)->loaded) {
        return 0;
    }
    int64_t device = ordinal_of(((ModuleObject *)mod)->device);
    if (device < 0) {
        return 0;
    }
    /* Python code may run while the arguments and the current stream are resolved; none runs after. The
     * module and the spec are held meanwhile (the fields that lent them could change). */
    Py_INCREF(mod);
    Py_INCREF(spec);
    PyObject *resolved = resolve_array_args(args, spec);
    PyObject *cur = resolved == NULL ? NULL : stream == NULL || stream == Py_None ? current_for_direct(device) : Py_NewRef(stream);
    int r = kernel_direct_resolved(kernel, v, fn, mod, spec, device, cur, resolved);
    Py_XDECREF(cur);
    Py_XDECREF(resolved);
    Py_DECREF(spec);
    Py_DECREF(mod);
    return resolved == NULL ? -1 : r;
}

/* kernel_direct past the resolution of its arguments (resolved) and of its stream (cur; NULL: not on the
 * direct path). No Python code runs here until the driver has the launch. */
static int
kernel_direct_resolved(PyObject *kernel, const int64_t v[7], int64_t fn, PyObject *mod, PyObject *spec,
                       int64_t device, PyObject *cur, PyObject *resolved)
{
    if (cur == NULL || resolved == NULL) {
        return 0;
    }
    /* From here to the driver's call no Python code runs: the checks hold until the launch. The module, the
     * kernel's fields and the stream are read again after the resolution above. */
    uint64_t handle = ((KernelObject *)kernel)->direct == fn && ((ModuleObject *)mod)->loaded &&
                              no_pending_graph_memory()
                          ? direct_stream(cur, device)
                          : 0;
    if (handle == 0) {
        return 0;
    }
    unsigned char packed[LAUNCH_MAX_PACKED];
    size_t len = 0;
    int r = launch_pack(resolved, spec, packed, &len); /* runs no Python code: numbers, numpy scalars, typed values, Buffers */
    if (r <= 0) {
        return r;
    }
    /* The driver reads each parameter through a pointer: each value gets an aligned slot of its own. */
    uint64_t slots[LAUNCH_MAX_PACKED / 4];
    void *params[LAUNCH_MAX_PACKED / 4];
    size_t n = 0;
    for (size_t off = 0; off < len; n++) {
        size_t size = packed[off + 1];
        slots[n] = 0;
        memcpy(&slots[n], packed + off + 3, size);
        params[n] = &slots[n];
        off += 3 + size;
    }
    const unsigned int grid[3] = {(unsigned int)v[0], (unsigned int)v[1], (unsigned int)v[2]};
    const unsigned int block[3] = {(unsigned int)v[3], (unsigned int)v[4], (unsigned int)v[5]};
    return direct_launch(device, (uint64_t)fn, grid, block, (unsigned int)v[6], handle, params);
}

static PyObject *
fast_launch_direct(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    int64_t v[7];
    static const char *names[7] = {"gx", "gy", "gz", "bx", "by", "bz", "shared_mem"};
    if (door_enter("launch", nargs, 10) < 0) {
        return NULL;
    }
    for (int i = 0; i < 7; i++) {
        if (door_int(args[i + 1], "launch", names[i], &v[i]) < 0) {
            return NULL;
        }
    }
    int r = kernel_direct(args[0], v, args[8], args[9]);
    return r < 0 ? NULL : PyBool_FromLong(r);
}

/* The module functions of this file, added to cudacore._fast at init (fast.c). */
PyMethodDef cc_launch_functions[] = {
    {"graph_launch_direct", (PyCFunction)(void (*)(void))fast_graph_launch_direct, METH_FASTCALL,
     graph_launch_direct_doc},
    {"launch", (PyCFunction)(void (*)(void))fast_launch, METH_FASTCALL, launch_doc},
    {"launch_direct", (PyCFunction)(void (*)(void))fast_launch_direct, METH_FASTCALL, launch_direct_doc},
    {NULL, NULL, 0, NULL},
};
