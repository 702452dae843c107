// The allocator entry points PyTorch's CUDAPluggableAllocator loads (cudacore.interop.torch_allocator):
// the C door for PyTorch. They pass the same guard as every other door: the fork check before Go is
// entered, then the generated entries of the facade (TorchMalloc, TorchFree), whose Go guard recovers
// panics and encodes errors.
//
// PyTorch does not check what a pluggable malloc returns (a NULL became a tensor with a null data
// pointer), but it does honour a C++ exception, which its Python bindings turn into RuntimeError. Go
// cannot throw one, so this shim does, with the sentence of cudacore's error (WireMessage decodes it in
// Go: the wire grammar is parsed nowhere else in C or C++).
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <sys/types.h>

extern "C" {
#include "door_gen.h"
extern volatile int cudacore_forked;
}

static const char kForked[] =
    "cudacore: this process was forked from a parent that had loaded cudacore; CUDA and the Go runtime do "
    "not survive fork(). Start worker processes with the spawn method "
    "(multiprocessing.get_context('spawn')).";

// fail throws the person-readable sentence of a wire-format error text, which it frees.
[[noreturn]] static void fail(char *wire) {
    char *msg = nullptr;
    std::string text = "cudacore: ";
    char *err = cudacore_door_WireMessage(wire, &msg);
    if (err == nullptr && msg != nullptr) {
        text += msg;
    } else {
        text += wire;
    }
    std::free(err);
    std::free(msg);
    std::free(wire);
    throw std::runtime_error(text);
}

extern "C" void *cudacore_torch_alloc(ssize_t size, int device, void *stream) {
    if (cudacore_forked) {
        throw std::runtime_error(kForked);
    }
    int64_t p = 0;
    char *err = cudacore_door_TorchMalloc(static_cast<int64_t>(size), device,
                                          static_cast<int64_t>(reinterpret_cast<uintptr_t>(stream)), &p);
    if (err != nullptr) {
        fail(err);  // also recorded for cudacore.interop.last_error()
    }
    return reinterpret_cast<void *>(static_cast<uintptr_t>(p));
}

// cudacore_torch_free cannot throw (PyTorch calls it from destructors): a failure is recorded for
// cudacore.interop.last_error() and the memory is left alone.
extern "C" void cudacore_torch_free(void *ptr, ssize_t size, int device, void *stream) {
    (void)size, (void)device, (void)stream;  // the allocation's own record is used
    if (cudacore_forked) {
        return;  // a forked child must not enter Go; its parent still owns the memory
    }
    int64_t ret = 0;
    std::free(cudacore_door_TorchFree(static_cast<int64_t>(reinterpret_cast<uintptr_t>(ptr)), &ret));
}
