// A host program standing in for PyTorch (scripts/check_dist.sh builds it with the system g++): it embeds
// Python, imports the installed cudacore, and calls the PyTorch allocator entry point of its extension
// with a request no device can hold. The shim must throw a C++ exception that this program, built with
// the system's libstdc++ as PyTorch is, catches as std::exception; a wheel whose shim links another C++
// runtime or unwinder (zig's static libc++) could terminate the process here instead.
//
// Exit status: 0 when the exception arrived with cudacore's out-of-memory sentence, 1 when it did not,
// 2 when the extension could not be reached.
#include <Python.h>
#include <dlfcn.h>
#include <sys/types.h>

#include <cstdio>
#include <cstring>
#include <exception>

using alloc_fn = void *(*)(ssize_t, int, void *);

int main() {
    Py_Initialize();
    PyObject *interop = PyImport_ImportModule("cudacore.interop");
    PyObject *path = interop ? PyObject_CallMethod(interop, "extension_path", nullptr) : nullptr;
    const char *file = path ? PyUnicode_AsUTF8(path) : nullptr;
    if (file == nullptr) {
        PyErr_Print();
        return 2;
    }
    void *lib = dlopen(file, RTLD_NOW | RTLD_NOLOAD);
    auto alloc = lib ? reinterpret_cast<alloc_fn>(dlsym(lib, "cudacore_torch_alloc")) : nullptr;
    if (alloc == nullptr) {
        std::printf("shim probe: no cudacore_torch_alloc in %s\n", file);
        return 2;
    }
    try {
        void *p = alloc(static_cast<ssize_t>(1) << 50, 0, nullptr);
        std::printf("shim probe: a 1 PiB allocation returned %p instead of throwing\n", p);
        return 1;
    } catch (const std::exception &e) {
        std::printf("shim probe: caught std::exception: %s\n", e.what());
        return std::strstr(e.what(), "out of memory") != nullptr ? 0 : 1;
    }
}
