/*
 * Buffer: device memory as a C type (no per-instance dict), its close and deallocation, its DLPack export,
 * and the hot cases of copy_from / copy_to (a PinnedBuffer or host memory of the buffer protocol, on a
 * cudacore Stream or synchronously), made on the direct path or through the doors without a Python frame.
 *
 * Ownership: a Buffer owns its device allocation from creation until a close() or deallocation whose free
 * succeeds; close() is idempotent, and a free that fails leaves the object open, so that close() can be
 * retried. A borrowed Buffer (interop.ExternalBuffer) owns nothing: its close drops its owner.
 */
#include "fast.h"


/* ---------------------------------------------------------------------------------------------------- */
/* Buffer: device memory                                                                                */

/* Wait, with the GIL released in between, until another thread's free of this object has returned (it
 * released the GIL for the driver call). Afterwards the object is closed, or open again if that free
 * failed. In a forked child it returns at once: the thread of that free is not in the child, so the flag
 * never clears (and the child frees nothing). Called with the GIL held. */
void
wait_for_free(volatile char *freeing)
{
    while (*freeing && !cudacore_forked) {
        Py_BEGIN_ALLOW_THREADS
        sched_yield();
        Py_END_ALLOW_THREADS
    }
}

/* Uses: calls that use a Buffer's memory with the GIL released (a copy, a fill). Each counts in the
 * Buffer's uses for the call, and close() waits until none is left (buffer_free). The Buffers that this
 * thread's uses hold are listed here as well, innermost last: a close on this thread of one of them (from
 * a finalizer that the collector runs during the call, say) would wait for itself, so it is refused. Uses
 * nest only as deep as the calls that make them; past USES_HERE_MAX the list stops, and a close on this
 * thread of any Buffer in use is refused (used_on_this_thread). */
#define USES_HERE_MAX 8
static _Thread_local BufferObject *uses_here[USES_HERE_MAX];
static _Thread_local int n_uses_here;

static void
use_begin(BufferObject *b)
{
    b->uses++;
    if (n_uses_here < USES_HERE_MAX) {
        uses_here[n_uses_here] = b;
    }
    n_uses_here++;
}

static void
use_end(BufferObject *b)
{
    b->uses--;
    n_uses_here--;
    if (n_uses_here < USES_HERE_MAX) {
        uses_here[n_uses_here] = NULL; /* uses end in the reverse order they began */
    }
}

/* Whether a use on this thread holds b. Past USES_HERE_MAX nested uses the list is incomplete, and any
 * Buffer in use may be this thread's: it answers yes, so that a close refuses rather than waits for
 * itself. */
static int
used_on_this_thread(const BufferObject *b)
{
    if (n_uses_here > USES_HERE_MAX) {
        return 1;
    }
    for (int i = 0; i < n_uses_here; i++) {
        if (uses_here[i] == b) {
            return 1;
        }
    }
    return 0;
}

/* Free the allocation if still open. Returns 0, or -1 with an exception set (the buffer stays open, so
 * that the free can be retried). A close that finds another thread's free in flight waits for it, so
 * that it returns only once the memory is gone (or raises if that free failed and its own retry does);
 * one that finds calls of other threads using the memory (uses) waits for them, and then checks again
 * from the start; a Ctrl-C ends that wait with KeyboardInterrupt, the buffer still open (except in a
 * destructor, dealloc, which cannot raise and waits on). In a forked child nothing is freed: Go must not be entered there, and
 * the memory belongs to the parent's context anyway; nor is anything waited for, since the threads whose
 * free or uses were under way at the fork are not in the child and would never end them. */
/* Let other threads run while this one waits for them, with the GIL released: a yield at first (most
 * waits are short: the rest of a copy), then sleeps of 100 µs, so that a wait for a long copy does not
 * keep a core busy. *waits counts the pauses so far. */
static void
pause_for_others(int *waits)
{
    int yield = *waits < 100;
    (*waits)++;
    Py_BEGIN_ALLOW_THREADS
    if (yield) {
        sched_yield();
    } else {
        struct timespec pause = {0, 100000};
        nanosleep(&pause, NULL);
    }
    Py_END_ALLOW_THREADS
}

int
buffer_free(BufferObject *self, int dealloc)
{
    int waits = 0;
    for (;;) {
        wait_for_free(&self->freeing);
        if (self->closed) {
            return 0;
        }
        if (self->dlpack_exports > 0) {
            PyErr_Format(PyExc_BufferError,
                         "cannot close a Buffer while %zd DLPack export%s of it (a CuPy/PyTorch/... array made by "
                         "from_dlpack) %s alive; delete %s first",
                         self->dlpack_exports, self->dlpack_exports == 1 ? "" : "s",
                         self->dlpack_exports == 1 ? "is" : "are", self->dlpack_exports == 1 ? "it" : "them");
            return -1;
        }
        if (self->views > 0) {
            Py_ssize_t n = self->views;
            PyErr_Format(PyExc_BufferError,
                         "cannot close a Buffer while %zd view%s of it (buf[start:stop]) %s open: the view%s share%s its "
                         "memory; close %s first (or let %s be collected)",
                         n, n == 1 ? "" : "s", n == 1 ? "is" : "are", n == 1 ? "" : "s", n == 1 ? "s" : "",
                         n == 1 ? "it" : "them", n == 1 ? "it" : "them");
            return -1;
        }
        if (self->uses == 0 || cudacore_forked) {
            break;
        }
        if (used_on_this_thread(self)) {
            PyErr_SetString(PyExc_BufferError,
                            "cannot close a Buffer while a call on this thread uses its memory (a copy or a fill of "
                            "it is under way here, and this close runs inside it, from a finalizer say); close it "
                            "once that call has returned");
            return -1;
        }
        /* A call of another thread, which needs the GIL to end. Ctrl-C ends the wait (not a destructor's,
         * which cannot raise): the Buffer stays open, and its close can be tried again. */
        if (!dealloc && PyErr_CheckSignals() < 0) {
            return -1;
        }
        pause_for_others(&waits);
    }
    if (self->borrowed) {
        self->closed = 1;
        if (self->is_view && self->owner != NULL) {
            ((BufferObject *)self->owner)->views--; /* the parent's memory is no longer held by this view */
            self->is_view = 0;
        }
        Py_CLEAR(self->owner);
        return 0;
    }
    if (cudacore_forked) {
        if (dealloc) {
            self->closed = 1;
            return 0;
        }
        return door_check_fork("Buffer.close");
    }
    if (self->graph_token == 0 && self->recyclable && recycle_ok() &&
        cc_recycle_free(self->device, self->ptr, self->size, self->stream)) {
        self->closed = 1; /* Go frees it, or accounts for its reuse, before anything else it does */
        return 0;
    }
    char *err;
    int64_t ret;
    PyThreadState *released = NULL;
    if (door_blocking(self->device)) {
        self->freeing = 1;
        released = PyEval_SaveThread();
    }
    if (self->graph_token != 0) {
        err = cudacore_door_GraphFree(self->device, (int64_t)self->ptr, (int64_t)self->size, (int64_t)self->stream,
                                      self->graph_token, &ret);
    } else {
        err = cudacore_door_Free(self->device, (int64_t)self->ptr, (int64_t)self->size, (int64_t)self->stream, &ret);
    }
    if (released != NULL) {
        PyEval_RestoreThread(released);
    }
    self->freeing = 0;
    if (err != NULL) {
        door_raise(err);
        return -1;
    }
    self->closed = 1;
    Py_CLEAR(self->keep); /* freed: its stream may go (this can run its owner's destroy) */
    return 0;
}

static int
buffer_free_dealloc(PyObject *self)
{
    int r = buffer_free((BufferObject *)self, 1);
    Py_CLEAR(((BufferObject *)self)->keep); /* after the free: it may destroy the stream */
    return r;
}

/* The end of an owning object (Buffer, PinnedBuffer): free what it still owns with free_fn, reporting a
 * failure as unraisable (a destructor cannot raise), then clear weak references and release the object. */
void
dealloc_owner(PyObject *self, int (*free_fn)(PyObject *), PyObject *weakreflist)
{
    PyObject *etype, *evalue, *etb; /* Fetch/Restore rather than GetRaisedException: 3.10 and 3.11 */
    PyErr_Fetch(&etype, &evalue, &etb);
    if (free_fn(self) < 0) {
        PyErr_WriteUnraisable(NULL); /* not self: a hook that kept it would resurrect a freed object */
    }
    PyErr_Restore(etype, evalue, etb);
    if (weakreflist != NULL) {
        PyObject_ClearWeakRefs(self);
    }
    Py_TYPE(self)->tp_free(self);
}

static void
buffer_dealloc(BufferObject *self)
{
    dealloc_owner((PyObject *)self, buffer_free_dealloc, self->weakreflist);
}

static PyObject *
buffer_close(BufferObject *self, PyObject *Py_UNUSED(ignored))
{
    if (buffer_free(self, 0) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyObject *
buffer_enter(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    return Py_NewRef(self);
}

static PyObject *
buffer_exit(BufferObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)args;
    (void)nargs;
    if (buffer_free(self, 0) < 0) {
        return NULL;
    }
    Py_RETURN_FALSE;
}

static PyObject *
buffer_get_ptr(BufferObject *self, void *Py_UNUSED(closure))
{
    if (buffer_gone(self)) {
        /* a view's parent is closed only when its memory went void (Buffer._void: graph memory) */
        return door_closed("Buffer", "cudacore.buffer");
    }
    return PyLong_FromUnsignedLongLong(self->ptr);
}

static PyObject *
buffer_get_owner(BufferObject *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(self->owner != NULL ? self->owner : Py_None);
}

static PyObject *
buffer_get_borrowed(BufferObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->borrowed);
}

/* ---- DLPack export ------------------------------------------------------------------------------------
 * The structs of dlpack.h (v1.0), declared by hand: the ABI is fixed by the spec. A Buffer exports itself
 * as a 1-D uint8 tensor; the capsule's DLManagedTensor holds a reference to the Buffer, dropped by the
 * deleter that the consumer calls when it is done (or by the capsule's destructor if nobody consumed it). */

/* The DLPack structs and constants are generated (tables_gen.h, from cudacore/internal/tablegen). */

/* One malloc'd block per export: the managed tensor, then shape and strides. */
typedef struct {
    DLManagedTensor m;
    int64_t shape[1];
    int64_t strides[1];
} LegacyExport;

typedef struct {
    DLManagedTensorVersioned m;
    int64_t shape[1];
    int64_t strides[1];
} VersionedExport;

static void
dlpack_release_buffer(void *ctx)
{
    if (ctx == NULL || !Py_IsInitialized()) {
        return;
    }
    /* Consumers may call the deleter from any thread, with or without the GIL. */
    PyGILState_STATE g = PyGILState_Ensure();
    BufferObject *b = (BufferObject *)ctx;
    b->dlpack_exports--;
    Py_DECREF(b);
    PyGILState_Release(g);
}

static void
dlpack_legacy_deleter(DLManagedTensor *m)
{
    dlpack_release_buffer(m->manager_ctx);
    free(m);
}

static void
dlpack_versioned_deleter(DLManagedTensorVersioned *m)
{
    dlpack_release_buffer(m->manager_ctx);
    free(m);
}

static void
dlpack_capsule_destructor(PyObject *capsule)
{
    /* Consumed capsules were renamed used_dltensor[_versioned]; the consumer calls the deleter then. */
    PyObject *etype, *evalue, *etb;
    PyErr_Fetch(&etype, &evalue, &etb);
    if (PyCapsule_IsValid(capsule, "dltensor")) {
        DLManagedTensor *m = (DLManagedTensor *)PyCapsule_GetPointer(capsule, "dltensor");
        if (m != NULL && m->deleter != NULL) {
            m->deleter(m);
        }
    } else if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {
        DLManagedTensorVersioned *m =
            (DLManagedTensorVersioned *)PyCapsule_GetPointer(capsule, "dltensor_versioned");
        if (m != NULL && m->deleter != NULL) {
            m->deleter(m);
        }
    }
    PyErr_Restore(etype, evalue, etb);
}

/* The CUDA stream value of the DLPack spec: None is the legacy default stream (1; 0 means it too), 2 the
 * per-thread default stream, -1 "do not order", anything else a CUstream of the consumer's. */
static int
dlpack_stream_arg(PyObject *arg, int64_t *out)
{
    if (arg == NULL || arg == Py_None) {
        *out = 1;
        return 0;
    }
    if (door_int(arg, "__dlpack__", "stream", out) < 0) {
        return -1;
    }
    if (*out == 0) {
        *out = 1;
    }
    return 0;
}

static PyObject *
buffer_dlpack(BufferObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream_arg = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOO:__dlpack__", kwlist, &stream_arg, &max_version,
                                     &dl_device, &copy)) {
        return NULL;
    }
    if (door_check_fork("__dlpack__") < 0) {
        return NULL;
    }
    if (buffer_gone(self)) {
        return door_closed("Buffer", "cudacore.dlpack");
    }
    if (copy != Py_None) {
        int want = PyObject_IsTrue(copy);
        if (want < 0) {
            return NULL;
        }
        if (want) {
            PyErr_SetString(PyExc_BufferError, "__dlpack__(copy=True): a cudacore Buffer exports its own memory "
                                               "only; copy it first (cudacore.device_to_device) and export the copy");
            return NULL;
        }
    }
    if (dl_device != Py_None) {
        long long dtype = -1, did = -1;
        if (!PyTuple_Check(dl_device) || PyTuple_GET_SIZE(dl_device) != 2) {
            PyErr_SetString(PyExc_TypeError, "__dlpack__: dl_device must be a (device_type, device_id) tuple");
            return NULL;
        }
        int64_t t64, d64;
        if (door_int(PyTuple_GET_ITEM(dl_device, 0), "__dlpack__", "dl_device[0]", &t64) < 0 ||
            door_int(PyTuple_GET_ITEM(dl_device, 1), "__dlpack__", "dl_device[1]", &d64) < 0) {
            return NULL;
        }
        dtype = t64;
        did = d64;
        if (dtype != kDLCUDA || did != self->device) {
            PyErr_Format(PyExc_BufferError,
                         "__dlpack__: the buffer is on (%d, %lld) (kDLCUDA, device); cannot export to (%lld, %lld)",
                         kDLCUDA, (long long)self->device, dtype, did);
            return NULL;
        }
    }
    int versioned = 0;
    if (max_version != Py_None) {
        if (!PyTuple_Check(max_version) || PyTuple_GET_SIZE(max_version) < 1) {
            PyErr_SetString(PyExc_TypeError, "__dlpack__: max_version must be a (major, minor) tuple or None");
            return NULL;
        }
        int64_t major;
        if (door_int(PyTuple_GET_ITEM(max_version, 0), "__dlpack__", "max_version[0]", &major) < 0) {
            return NULL;
        }
        versioned = major >= 1;
    }
    int64_t consumer;
    if (dlpack_stream_arg(stream_arg, &consumer) < 0) {
        return NULL;
    }
    /* Memory its owner declared read-only (an ExternalBuffer of a read-only CUDA Array Interface or DLPack
     * tensor, and views of one: their Python classes say so) is exported read-only: DLPack 1.x carries the
     * flag, and a legacy export, which cannot, is refused rather than handed out writable. Borrowed buffers
     * only: cudacore's own memory is never read-only. */
    int readonly = 0;
    if (self->borrowed) {
        PyObject *ro = PyObject_GetAttrString((PyObject *)self, "readonly");
        if (ro == NULL) {
            PyErr_Clear();
        } else {
            readonly = PyObject_IsTrue(ro) == 1;
            Py_DECREF(ro);
        }
        if (readonly && !versioned) {
            PyErr_SetString(PyExc_BufferError,
                            "__dlpack__: this memory is read-only and a DLPack export before version 1.0 cannot say "
                            "so: ask for max_version=(1, 0) or newer (from_dlpack of numpy, CuPy and PyTorch does)");
            return NULL;
        }
    }
    /* Stream order: the consumer will use the memory on its stream. Go records an event on the buffer's
     * stream and makes the consumer's stream wait on it, under the stream-lifetime and capture rules: the
     * host never waits, and a destroyed stream's handle never reaches the driver. A borrowed buffer's
     * order is its owner's business. */
    if (!no_pending_graph_memory()) {
        /* Graph memory of a graph never launched has no memory behind it: Go refuses its export. */
        int64_t ret;
        char *err = cudacore_door_CheckDLPackExport(self->device, (int64_t)self->ptr, (int64_t)self->size, &ret);
        if (err != NULL) {
            return door_raise(err);
        }
    }
    if (!self->borrowed || self->ordered) { /* a view is ordered on its parent's stream, which it carries */
        int64_t ret;
        char *err = cudacore_door_DLPackOrder(self->device, (int64_t)self->stream, consumer, &ret);
        if (err != NULL) {
            return door_raise(err);
        }
    }
    DLTensor *t;
    void *block;
    const char *name;
    if (versioned) {
        VersionedExport *e = calloc(1, sizeof(VersionedExport));
        if (e == NULL) {
            return PyErr_NoMemory();
        }
        e->m.version.major = 1;
        e->m.version.minor = 0;
        e->m.manager_ctx = self;
        e->m.deleter = dlpack_versioned_deleter;
        e->m.flags = readonly ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
        e->shape[0] = (int64_t)self->size;
        e->strides[0] = 1;
        t = &e->m.dl_tensor;
        t->shape = e->shape;
        t->strides = e->strides;
        block = e;
        name = "dltensor_versioned";
    } else {
        LegacyExport *e = calloc(1, sizeof(LegacyExport));
        if (e == NULL) {
            return PyErr_NoMemory();
        }
        e->m.manager_ctx = self;
        e->m.deleter = dlpack_legacy_deleter;
        e->shape[0] = (int64_t)self->size;
        e->strides[0] = 1;
        t = &e->m.dl_tensor;
        t->shape = e->shape;
        t->strides = e->strides;
        block = e;
        name = "dltensor";
    }
    t->data = (void *)(uintptr_t)self->ptr;
    t->device.device_type = kDLCUDA;
    t->device.device_id = (int32_t)self->device;
    t->ndim = 1;
    t->dtype.code = kDLUInt;
    t->dtype.bits = 8;
    t->dtype.lanes = 1;
    t->byte_offset = 0;
    PyObject *capsule = PyCapsule_New(block, name, dlpack_capsule_destructor);
    if (capsule == NULL) {
        free(block);
        return NULL;
    }
    /* Only now does the capsule own the block: take the reference its deleter drops. */
    Py_INCREF(self);
    self->dlpack_exports++;
    return capsule;
}

static PyObject *
buffer_dlpack_device(BufferObject *self, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("(iL)", kDLCUDA, (long long)self->device);
}

/* What part of a copy's two sides moves: nbytes (-1: all of both, which must then be the same size), the
 * byte offset into the Buffer and into the host memory. Every field was checked to be an int >= 0 (or
 * nbytes absent); whether they fit the two sides is copy_span's question. */
typedef struct {
    int64_t nbytes, offset, host_offset;
} copy_part;

/* The bytes to move for part, with the buffer holding size bytes and the host memory host_len: 1 and *n
 * set when the copy fits both sides as the general path (python/cudacore/_copy.py, transfer) would make
 * it, 0 when it does not or moves nothing (the general path explains or handles it). */
static int
copy_span(const copy_part *part, uint64_t size, uint64_t host_len, int64_t *n)
{
    if ((uint64_t)part->offset > size || (uint64_t)part->host_offset > host_len) {
        return 0;
    }
    uint64_t mine = size - (uint64_t)part->offset, theirs = host_len - (uint64_t)part->host_offset;
    if (part->nbytes < 0) {
        if (mine != theirs) {
            return 0;
        }
        *n = (int64_t)mine;
    } else {
        if ((uint64_t)part->nbytes > mine || (uint64_t)part->nbytes > theirs) {
            return 0;
        }
        *n = part->nbytes;
    }
    return *n > 0;
}

/* Whether the general path would take host as host memory, as _copy._classify decides: an object with
 * __cuda_array_interface__ or __dlpack_device__ may be device memory that also offers the buffer protocol
 * (a numba mapped array), so it is the general path's to classify. The common host types are known
 * without a lookup. */
static int
plainly_host(PyObject *host)
{
    if (PyBytes_CheckExact(host) || PyByteArray_CheckExact(host) || PyMemoryView_Check(host) ||
        PyObject_TypeCheck(host, &PinnedType) || strcmp(Py_TYPE(host)->tp_name, "numpy.ndarray") == 0) {
        return 1;
    }
    return !PyObject_HasAttrString(host, "__cuda_array_interface__") && !PyObject_HasAttrString(host, "__dlpack_device__");
}

/* Whether copying into self is the general path's to refuse: memory its owner declared read-only (a
 * borrowed Buffer, or a view of one, whose readonly says so). cudacore's own memory never is. */
static int
refuses_writes(BufferObject *self)
{
    if (!self->borrowed) {
        return 0;
    }
    PyObject *ro = PyObject_GetAttrString((PyObject *)self, "readonly");
    int r = ro == NULL || PyObject_IsTrue(ro) != 0; /* unreadable: the general path decides */
    Py_XDECREF(ro);
    PyErr_Clear();
    return r;
}

/* The hot case of Buffer.copy_from / copy_to: a PinnedBuffer (all of it, or the part that nbytes= and the offsets name) on a cudacore Stream of the
 * buffer's device. The copy takes the direct path when it may (direct_stream), and otherwise, up to
 * CC_HELD_COPY_MAX bytes (tables_gen.h), the generated door of CopyToDeviceHeld/CopyToHostHeld, with the pinned memory itself
 * (cudacore's own allocation: no buffer export needed). 1 done, 0 not the hot case (nothing done), -1
 * error set. */
static int
copy_hot(BufferObject *self, PyObject *host, PyObject *stream, const copy_part *part, int to_device)
{
    if (!PyObject_TypeCheck(stream, &StreamType) || !PyObject_TypeCheck(host, &PinnedType) ||
        buffer_gone(self)) {
        return 0;
    }
    PinnedObject *h = (PinnedObject *)host;
    int64_t n;
    if (h->closed || h->freeing || !copy_span(part, self->size, h->size, &n) || (to_device && refuses_writes(self))) {
        return 0; /* the general path explains */
    }
    if (door_check_fork(to_device ? "copy_from" : "copy_to") < 0) {
        return -1;
    }
    uint64_t dptr = self->ptr + (uint64_t)part->offset, hptr = h->ptr + (uint64_t)part->host_offset;
    /* Direct, any size: the driver only enqueues a copy from pinned memory, with the GIL held throughout. */
    uint64_t direct = no_pending_graph_memory() ? direct_stream(stream, self->device) : 0;
    if (direct != 0 &&
        (to_device ? direct_copy_to_device(self->device, dptr, (const void *)(uintptr_t)hptr, (size_t)n, direct)
                   : direct_copy_to_host(self->device, (void *)(uintptr_t)hptr, dptr, (size_t)n, direct))) {
        return 1;
    }
    /* Through Go with the GIL held up to CC_HELD_COPY_MAX bytes; a larger copy goes to the general path, which
     * releases the GIL with the memory held by its buffer export. */
    if (n > CC_HELD_COPY_MAX) {
        return 0;
    }
    int64_t sh = stream_handle_on(stream, self->device);
    if (sh < 0) {
        return 0;
    }
    int64_t ret;
    char *err = to_device ? cudacore_door_CopyToDeviceHeld(self->device, (int64_t)dptr, (const void *)(uintptr_t)hptr, n, n, sh, &ret)
                          : cudacore_door_CopyToHostHeld(self->device, (void *)(uintptr_t)hptr, n, (int64_t)dptr, n, sh, &ret);
    if (err != NULL) {
        door_raise(err);
        return -1;
    }
    return 1;
}

/* The hot case of copy_from / copy_to with host memory of the buffer protocol (a PinnedBuffer too, not a
 * device Buffer), as the general path sizes it, through the CopyToDevice / CopyToHost door as the general
 * path would call it: on stream, whose handle is sh, or synchronously for stream NULL and sh -1. A
 * synchronous copy releases the GIL; one on a stream keeps it up to CC_HELD_COPY_MAX bytes (the Held doors, or the
 * direct path for a host-to-device copy the driver stages), as the general path does. The host memory is
 * held through its buffer export for the call, so a PinnedBuffer cannot be closed by another thread
 * meanwhile (its close refuses while exports live). 1 done, 0 not this case (nothing done, no exception),
 * -1 error set. */
static int
copy_export_hot(BufferObject *self, PyObject *host, PyObject *stream, int64_t sh, const copy_part *part, int to_device)
{
    if (buffer_gone(self) || PyObject_TypeCheck(host, &BufferType) || !PyObject_CheckBuffer(host) ||
        !plainly_host(host) || (to_device && refuses_writes(self))) {
        return 0;
    }
    Py_buffer view;
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (to_device ? 0 : PyBUF_WRITABLE);
    if (PyObject_GetBuffer(host, &view, flags) < 0) {
        PyErr_Clear(); /* the general path says what is wrong */
        return 0;
    }
    /* The part that moves must fit both sides as the general path sizes them (without nbytes= both sides
     * from their offsets hold the same number of bytes; anything else is the general path's to refuse,
     * saying what to pass). */
    int64_t n;
    if ((view.format != NULL && strchr(view.format, 'O') != NULL) || !copy_span(part, self->size, (uint64_t)view.len, &n)) {
        PyBuffer_Release(&view);
        return 0;
    }
    /* Closed since the check on entry: the checks above and the export may run Python code (a subclass's
     * __getattr__, say), which can close it, or let another thread run that does. Nothing below runs any
     * before the copy (or use_begin) names the memory. */
    if (buffer_gone(self)) {
        PyBuffer_Release(&view);
        return 0;
    }
    if (door_check_fork(to_device ? "copy_from" : "copy_to") < 0) {
        PyBuffer_Release(&view);
        return -1;
    }
    int64_t ret;
    char *err;
    int64_t device = self->device, ptr = (int64_t)(self->ptr + (uint64_t)part->offset);
    char *hbuf = (char *)view.buf + part->host_offset;
    int64_t hlen = (int64_t)view.len - part->host_offset;
    /* A small copy on a stream keeps the GIL host to device only: one to the host through this path may
     * land in pageable memory, which waits for the work queued on the stream first (a PinnedBuffer, which
     * does not wait, is copy_hot's), and the GIL held across that wait would stop every thread and Ctrl-C. */
    if (sh >= 0 && n <= CC_HELD_COPY_MAX && to_device) {
        /* Direct when the stream manager would hand this copy to the driver's own pageable copy (which
         * stages it and returns once it has read the host memory; memory the driver knows as pinned is
         * read when the stream gets there, as documented for pinned memory). */
        uint64_t direct;
        if (to_device && direct_pageable(device, (size_t)n) && no_pending_graph_memory() &&
            (direct = direct_stream(stream, device)) != 0 &&
            direct_copy_to_device(device, (uint64_t)ptr, hbuf, (size_t)n, direct)) {
            PyBuffer_Release(&view);
            return 1;
        }
        err = cudacore_door_CopyToDeviceHeld(device, ptr, hbuf, hlen, n, sh, &ret);
    } else {
        use_begin(self); /* no Python code runs on this thread until use_end */
        Py_BEGIN_ALLOW_THREADS
        err = to_device ? cudacore_door_CopyToDevice(device, ptr, hbuf, hlen, n, sh, &ret)
                        : cudacore_door_CopyToHost(device, hbuf, hlen, ptr, n, sh, &ret);
        Py_END_ALLOW_THREADS
        use_end(self);
    }
    PyBuffer_Release(&view);
    if (err != NULL) {
        door_raise(err);
        return -1;
    }
    return 1;
}

/* The synchronous hot case: stream=None while no `with stream:` block is open (see copy_export_hot). */
static int
copy_sync_hot(BufferObject *self, PyObject *host, const copy_part *part, int to_device)
{
    return no_stream_blocks() ? copy_export_hot(self, host, NULL, -1, part, to_device) : 0;
}

/* The asynchronous hot case past copy_hot: a cudacore Stream of the buffer's device and host memory of the
 * buffer protocol, pageable or pinned (see copy_export_hot). */
static int
copy_stream_hot(BufferObject *self, PyObject *host, PyObject *stream, const copy_part *part, int to_device)
{
    int64_t sh = stream_handle_on(stream, self->device);
    return sh < 0 ? 0 : copy_export_hot(self, host, stream, sh, part, to_device);
}

/* stream=None while a `with stream:` block is open on some thread (copy_sync_hot's gate is shut). Where this
 * thread's current stream of the device is the legacy default one (the block is another thread's), the
 * synchronous copy, as copy_sync_hot makes it. Otherwise the copy on this thread's current Stream, then a
 * wait for it, as the general path does (_copy._finish); while any capture runs (the copy may belong to
 * it, and waiting would be illegal there) the general path decides. 1 done, 0 not this case, -1 error
 * set. */
static int
copy_current_hot(BufferObject *self, PyObject *host, const copy_part *part, int to_device)
{
    static PyObject *str_synchronize;
    if (no_stream_blocks() || buffer_gone(self)) {
        return 0; /* copy_sync_hot's case, declined there */
    }
    PyObject *cur = current_stream_object(self->device);
    if (cur == NULL) {
        PyErr_Clear(); /* nothing readable: the general path */
        return 0;
    }
    if (cur == Py_None) {
        Py_DECREF(cur);
        return copy_export_hot(self, host, NULL, -1, part, to_device);
    }
    if (cc_snapshot_capturing() || !PyObject_TypeCheck(cur, &StreamType) || ((StreamObject *)cur)->closed) {
        /* A current stream closed inside its block is the general path's to refuse, saying so: its handle
         * must not reach Go, where it names a closed stream, or one created since with the same handle. */
        Py_DECREF(cur);
        return 0;
    }
    int r = copy_hot(self, host, cur, part, to_device);
    if (r == 0) {
        r = copy_stream_hot(self, host, cur, part, to_device);
    }
    if (r > 0) {
        if (str_synchronize == NULL && (str_synchronize = PyUnicode_InternFromString("synchronize")) == NULL) {
            Py_DECREF(cur);
            return -1;
        }
        PyObject *done = PyObject_CallMethodNoArgs(cur, str_synchronize);
        r = done != NULL ? 1 : -1;
        Py_XDECREF(done);
    }
    Py_DECREF(cur);
    return r;
}

/* A keyword argument of the hot case: an exact int >= 0 into *out (nbytes may be None: -1). 0 when it is
 * anything else, for the general path to check and explain. */
static int
copy_int_arg(PyObject *v, int none_ok, int64_t *out)
{
    if (none_ok && v == Py_None) {
        *out = -1;
        return 1;
    }
    if (!PyLong_CheckExact(v)) {
        return 0;
    }
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow != 0 || x < 0) {
        PyErr_Clear();
        return 0;
    }
    *out = x;
    return 1;
}

/* The arguments of copy_from / copy_to as the hot case takes them: (host, stream=None) by position or
 * keyword, and nbytes=, offset=, src_offset= (copy_from) or dst_offset= (copy_to) as keywords of exact
 * ints. 1 with *host, *stream and *part set; 0 for anything else (the general path parses it). */
static int
copy_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, int to_device, PyObject **host, PyObject **stream,
          copy_part *part)
{
    Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    *host = NULL;
    *stream = Py_None;
    *part = (copy_part){-1, 0, 0};
    if (nargs < 1 || nargs > 2) {
        return 0;
    }
    *host = args[0];
    if (nargs == 2) {
        *stream = args[1];
    }
    const char *other_offset = to_device ? "src_offset" : "dst_offset";
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, i), *v = args[nargs + i];
        int ok;
        if (PyUnicode_CompareWithASCIIString(key, "stream") == 0 && nargs == 1) {
            *stream = v;
            ok = 1;
        } else if (PyUnicode_CompareWithASCIIString(key, "nbytes") == 0) {
            ok = copy_int_arg(v, 1, &part->nbytes);
        } else if (PyUnicode_CompareWithASCIIString(key, "offset") == 0) {
            ok = copy_int_arg(v, 0, &part->offset);
        } else if (PyUnicode_CompareWithASCIIString(key, other_offset) == 0) {
            ok = copy_int_arg(v, 0, &part->host_offset);
        } else {
            ok = 0;
        }
        if (!ok) {
            return 0;
        }
    }
    return 1;
}

/* copy_from(host, stream=None) / copy_to(host, stream=None): the hot case in C, anything else through the
 * subclass's _copy_from / _copy_to (python/cudacore/_memory.py), whose checks and errors are the
 * general ones. */
static PyObject *
buffer_copy(BufferObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, int to_device)
{
    const char *general = to_device ? "_copy_from" : "_copy_to";
    Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *host, *stream;
    copy_part part;
    if (copy_args(args, nargs, kwnames, to_device, &host, &stream, &part)) {
        int r = stream == Py_None ? copy_sync_hot(self, host, &part, to_device) : copy_hot(self, host, stream, &part, to_device);
        if (r == 0 && stream != Py_None) {
            r = copy_stream_hot(self, host, stream, &part, to_device);
        } else if (r == 0) {
            r = copy_current_hot(self, host, &part, to_device);
        }
        if (r < 0) {
            return NULL;
        }
        if (r > 0) {
            Py_RETURN_NONE;
        }
    }
    PyObject *name = PyUnicode_FromString(general);
    if (name == NULL) {
        return NULL;
    }
    /* Forward the call as it came: self first, then the caller's arguments and keywords. */
    PyObject *stack[8];
    Py_ssize_t total = nargs + nkw;
    if (total > 7) { /* more than the general path's (other, stream, nbytes, offset, other_offset) */
        Py_DECREF(name);
        PyErr_Format(PyExc_TypeError, "%s() takes at most 5 arguments (%zd given)", to_device ? "copy_from" : "copy_to", total);
        return NULL;
    }
    stack[0] = (PyObject *)self;
    for (Py_ssize_t i = 0; i < total; i++) {
        stack[i + 1] = args[i];
    }
    PyObject *r = PyObject_VectorcallMethod(name, stack, (size_t)(nargs + 1), kwnames);
    Py_DECREF(name);
    return r;
}

static PyObject *
buffer_copy_from(BufferObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return buffer_copy(self, args, nargs, kwnames, 1);
}

static PyObject *
buffer_copy_to(BufferObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return buffer_copy(self, args, nargs, kwnames, 0);
}

/* Buffer._void(): mark the buffer closed without freeing anything: its memory was never allocated by the
 * driver (graph memory of a capture that was aborted, or of a graph destroyed before its first launch),
 * and the address may belong to a later allocation. */
static PyObject *
buffer_void(BufferObject *self, PyObject *Py_UNUSED(ignored))
{
    wait_for_free(&self->freeing);
    self->closed = 1;
    Py_CLEAR(self->keep);
    Py_RETURN_NONE;
}

/* Buffer._view(offset, size, type): a view of size bytes at offset, of the Buffer subclass type (the
 * Python layer's __getitem__ checks the slice and says what is wrong; this checks the range again). The
 * view is borrowed (its close frees nothing) and owns a reference to this buffer, whose views count it
 * holds until it is closed or deallocated: this buffer's close() refuses meanwhile. */
static PyObject *
buffer_view(BufferObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t offset, size;
    if (door_enter("view", nargs, 3) < 0 || door_int(args[0], "view", "offset", &offset) < 0 ||
        door_int(args[1], "view", "size", &size) < 0) {
        return NULL;
    }
    if (!PyType_Check(args[2]) || !PyType_IsSubtype((PyTypeObject *)args[2], &BufferType)) {
        PyErr_SetString(PyExc_TypeError, "_view() needs a subclass of Buffer");
        return NULL;
    }
    if (buffer_gone(self)) {
        return door_closed("Buffer", "cudacore.view");
    }
    if (offset < 0 || size < 0 || (uint64_t)offset + (uint64_t)size > self->size) {
        door_invalid("view", "offset", "and size must lie inside the buffer", args[0]);
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)args[2];
    BufferObject *b = (BufferObject *)type->tp_alloc(type, 0);
    if (b == NULL) {
        return NULL;
    }
    b->ptr = self->ptr + (uint64_t)offset;
    b->size = (uint64_t)size;
    b->stream = self->stream;
    b->device = self->device;
    b->borrowed = 1;
    b->owner = Py_NewRef((PyObject *)self);
    b->closed = 0;
    b->is_view = 1;
    b->ordered = (char)(!self->borrowed || self->ordered);
    self->views++;
    return (PyObject *)b;
}

static PyObject *
buffer_get_views(BufferObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->views);
}

static PyMethodDef buffer_methods[] = {
    {"_view", (PyCFunction)(void (*)(void))buffer_view, METH_FASTCALL,
     "_view(offset, size, type)\n\nA view of size bytes at offset, of Buffer subclass type (cudacore internal: "
     "use buf[start:stop])."},
    {"_void", (PyCFunction)buffer_void, METH_NOARGS,
     "_void()\n\nMark closed without freeing: the driver never allocated this graph memory (cudacore internal)."},
    {"copy_from", (PyCFunction)(void (*)(void))buffer_copy_from, METH_FASTCALL | METH_KEYWORDS,
     "copy_from(src, stream=None, *, nbytes=None, offset=0, src_offset=0)\n\nCopy src (host memory, a device "
     "Buffer, or an array of the CUDA Array Interface or DLPack) into this buffer; with a stream, ordered on it."},
    {"copy_to", (PyCFunction)(void (*)(void))buffer_copy_to, METH_FASTCALL | METH_KEYWORDS,
     "copy_to(dst, stream=None, *, nbytes=None, offset=0, dst_offset=0)\n\nCopy this buffer into dst (writable "
     "host memory, a device Buffer, or an array of the CUDA Array Interface or DLPack); with a stream, ordered on it."},
    {"__dlpack__", (PyCFunction)(void (*)(void))buffer_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)\n\n"
     "A DLPack capsule of this buffer as a 1-D uint8 tensor (versioned, DLPack 1.0, when max_version >= "
     "(1, 0)). It keeps the buffer alive until the consumer deletes it; close() is refused meanwhile. When "
     "the consumer's stream is not the buffer's, the consumer's stream is made to wait for the buffer's work "
     "with an event (stream=-1: no ordering); the host does not wait."},
    {"__dlpack_device__", (PyCFunction)buffer_dlpack_device, METH_NOARGS,
     "__dlpack_device__() -> (2, device_id): kDLCUDA and the device ordinal."},
    {"close", (PyCFunction)buffer_close, METH_NOARGS,
     "close()\n\nFree the memory, in stream order on the buffer's stream. Idempotent."},
    {"__enter__", (PyCFunction)buffer_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))buffer_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

/* Plain fields are members; only what computes or checks (ptr raises once closed) is a getter. */
static PyMemberDef buffer_members[] = {
    {"size", T_ULONGLONG, offsetof(BufferObject, size), READONLY, "The size in bytes."},
    {"device_id", T_LONGLONG, offsetof(BufferObject, device), READONLY, "The ordinal of the device it lives on."},
    {"stream_handle", T_ULONGLONG, offsetof(BufferObject, stream), READONLY,
     "The driver handle of the stream it is ordered on (1: the legacy default stream)."},
    {"_graph_token", T_LONGLONG, offsetof(BufferObject, graph_token), 0,
     "Go's owner token of an allocation made during a capture, 0 otherwise (cudacore internal)."},
    {NULL, 0, 0, 0, NULL},
};

/* closed: the buffer's own close, or, for a view, its memory gone with a buffer it views (buffer_gone). */
static PyObject *
buffer_get_closed(BufferObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->closed || (self->is_view && self->owner != NULL &&
                                            buffer_gone((const BufferObject *)self->owner)));
}

static PyGetSetDef buffer_getset[] = {
    {"closed", (getter)buffer_get_closed, NULL,
     "Whether close() has freed it (for a view: closed, or the buffer it views is gone).", NULL},
    {"ptr", (getter)buffer_get_ptr, NULL, "The device address (raises once the buffer is closed).", NULL},
    {"owner", (getter)buffer_get_owner, NULL,
     "For a borrowed buffer (an ExternalBuffer), the object owning the memory; None otherwise.", NULL},
    {"_views", (getter)buffer_get_views, NULL, "The open views (buf[start:stop]) of this buffer.", NULL},
    {"borrowed", (getter)buffer_get_borrowed, NULL,
     "Whether this buffer views memory another library owns (close() then frees nothing).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject BufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudacore._fast.Buffer",
    .tp_basicsize = sizeof(BufferObject),
    .tp_dealloc = (destructor)buffer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Device memory owned by this object; made by Device.allocate.",
    .tp_weaklistoffset = offsetof(BufferObject, weakreflist),
    .tp_methods = buffer_methods,
    .tp_members = buffer_members,
    .tp_getset = buffer_getset,
};



/* ---------------------------------------------------------------------------------------------------- */
/* using(): a use of Buffers by a call of the Python layer                                              */

/* What using(a, b=None) returns: a context manager whose block is a use of the Buffers given (see Uses
 * above). The count begins in __enter__, not when the object is made, so that a KeyboardInterrupt raised
 * between the two (at the end of the call that made it) leaves nothing counted; the with statement runs
 * __exit__ for anything raised after __enter__. */
typedef struct {
    PyObject_HEAD
    PyObject *bufs[2];
    char entered;
} UseObject;

static void
use_leave(UseObject *u)
{
    if (!u->entered) {
        return;
    }
    u->entered = 0;
    for (int i = 1; i >= 0; i--) {
        if (u->bufs[i] != NULL) {
            use_end((BufferObject *)u->bufs[i]);
        }
    }
}

static PyObject *
use_enter(UseObject *u, PyObject *Py_UNUSED(ignored))
{
    if (!u->entered) {
        for (int i = 0; i < 2; i++) {
            if (u->bufs[i] != NULL) {
                use_begin((BufferObject *)u->bufs[i]);
            }
        }
        u->entered = 1;
    }
    Py_RETURN_NONE;
}

static PyObject *
use_exit(UseObject *u, PyObject *const *args, Py_ssize_t nargs)
{
    (void)args;
    (void)nargs;
    use_leave(u);
    Py_RETURN_FALSE;
}

static void
use_dealloc(UseObject *u)
{
    use_leave(u);
    Py_XDECREF(u->bufs[0]);
    Py_XDECREF(u->bufs[1]);
    Py_TYPE(u)->tp_free((PyObject *)u);
}

static PyMethodDef use_methods[] = {
    {"__enter__", (PyCFunction)use_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))use_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject UseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudacore._fast.Use",
    .tp_basicsize = sizeof(UseObject),
    .tp_dealloc = (destructor)use_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A use of Buffers by one call (cudacore internal: see using()).",
    .tp_methods = use_methods,
};

static PyObject *
fast_using(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "using(buffer, other=None)");
        return NULL;
    }
    UseObject *u = PyObject_New(UseObject, &UseType);
    if (u == NULL) {
        return NULL;
    }
    u->bufs[0] = u->bufs[1] = NULL;
    u->entered = 0;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        if (PyObject_TypeCheck(args[i], &BufferType)) {
            u->bufs[i] = Py_NewRef(args[i]);
        }
    }
    return (PyObject *)u;
}

PyMethodDef cc_buffer_functions[] = {
    {"using", (PyCFunction)(void (*)(void))fast_using, METH_FASTCALL,
     "using(buffer, other=None)\n\nA context manager: while its block runs, close() of the Buffers given (anything "
     "else is ignored) on another thread waits for it, and on this thread is refused (cudacore internal: for the "
     "calls that use their memory with the GIL released)."},
    {NULL, NULL, 0, NULL},
};
