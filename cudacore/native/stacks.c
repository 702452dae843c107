/*
 * Python stacks recorded for allocations (set_stack_frames): the caller's frames, labelled on the
 * allocation in Go's flight recorder.
 */
#include "fast.h"

/* ---------------------------------------------------------------------------------------------------- */
/* Python stacks for allocations (asked for with set_stack_frames)                                     */

/* stack_frames > 0: after each successful allocate(), the innermost stack_frames Python frames outside
 * stack_skip (cudacore's own package directory) are sent to Go as the allocation's label
 * (MemoryLabel). 0, the default, costs one load per allocation. Written with the GIL held only. */
int stack_frames;
static char stack_skip[1024];

void
label_allocation(int64_t device, int64_t ptr)
{
    char label[2048];
    size_t used = 0;
    int taken = 0;
    size_t skip_len = strlen(stack_skip);
    PyFrameObject *f = PyEval_GetFrame(); /* borrowed */
    Py_XINCREF(f);
    while (f != NULL && taken < stack_frames) {
        PyCodeObject *code = PyFrame_GetCode(f);
        const char *file = PyUnicode_AsUTF8(code->co_filename);
        const char *name = PyUnicode_AsUTF8(code->co_name);
        if (file == NULL || name == NULL) {
            PyErr_Clear();
        } else if (skip_len == 0 || strncmp(file, stack_skip, skip_len) != 0) {
            int n = snprintf(label + used, sizeof label - used, "%s%s:%d in %s", used ? "\n" : "", file,
                             PyFrame_GetLineNumber(f), name);
            if (n < 0 || (size_t)n >= sizeof label - used) {
                label[used] = 0; /* the frame that does not fit is left out whole */
                Py_DECREF(code);
                break;
            }
            used += (size_t)n;
            taken++;
        }
        Py_DECREF(code);
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    Py_XDECREF(f);
    label[used] = 0;
    int64_t ok = 0;
    char *err = cudacore_door_MemoryLabel(device, ptr, label, &ok);
    free(err); /* a label is best effort: an allocation never fails for want of one */
}

PyDoc_STRVAR(set_stack_frames_doc, "set_stack_frames(frames: int, skip: str) -> int\n\n"
                                   "Label each allocation with its innermost Python frames (0: off), leaving out "
                                   "files under skip; returns the previous count.");

static PyObject *
fast_set_stack_frames(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyLong_Check(args[0]) || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "set_stack_frames(frames: int, skip: str)");
        return NULL;
    }
    long n = PyLong_AsLong(args[0]);
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (n < 0 || n > 64) {
        PyErr_Format(PyExc_ValueError, "frames must be between 0 and 64, got %ld", n);
        return NULL;
    }
    const char *skip = PyUnicode_AsUTF8(args[1]);
    if (skip == NULL) {
        return NULL;
    }
    if (strlen(skip) >= sizeof stack_skip) {
        PyErr_SetString(PyExc_ValueError, "skip is too long");
        return NULL;
    }
    int prev = stack_frames;
    strcpy(stack_skip, skip);
    stack_frames = (int)n;
    return PyLong_FromLong(prev);
}

/* The module functions of this file, added to cudacore._fast at init (fast.c). */
PyMethodDef cc_stacks_functions[] = {
    {"set_stack_frames", (PyCFunction)(void (*)(void))fast_set_stack_frames, METH_FASTCALL, set_stack_frames_doc},
    {NULL, NULL, 0, NULL},
};
