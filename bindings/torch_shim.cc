// The allocation entry point PyTorch's CUDAPluggableAllocator loads (cudacore.interop.torch_allocator).
//
// PyTorch 2.11 does not check what a pluggable malloc returns: on the H100 a NULL from
// cudacore_torch_malloc (Go, cudacore/internal/interop) for a 64 TiB tensor became a tensor with a null
// data pointer, and no error. The one failure PyTorch does honour is a C++ exception, which its Python
// bindings turn into RuntimeError. Go cannot throw one, so this shim, compiled into the same extension
// library, calls the Go entry point and throws with cudacore's out-of-memory message on failure.
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <sys/types.h>

extern "C" {
uintptr_t cudacore_torch_malloc(ssize_t size, int device, uintptr_t stream);  // Go: internal/interop
char *cudacore_interop_peek_error(void);                                      // Go: malloc'd or NULL
}

// message strips the wire-format header (pkg/cuda/wire.go) from the recorded error: the person reading
// PyTorch's RuntimeError wants cudacore's sentence, not the codes.
static std::string message(const char *wire) {
    std::string s = wire ? wire : "allocation failed";
    if (s.rfind("cuda[", 0) == 0) {
        std::size_t close = s.find(']');
        if (close != std::string::npos) {
            std::size_t start = close + 1;
            if (start < s.size() && s[start] == '{') {
                std::size_t brace = s.find('}', start);
                start = brace == std::string::npos ? start : brace + 1;
            }
            if (s.compare(start, 2, ": ") == 0) {
                s = s.substr(start + 2);
            }
        }
    }
    return "cudacore: " + s;
}

extern "C" void *cudacore_torch_alloc(ssize_t size, int device, void *stream) {
    uintptr_t p = cudacore_torch_malloc(size, device, reinterpret_cast<uintptr_t>(stream));
    if (p == 0 && size > 0) {
        char *wire = cudacore_interop_peek_error();  // leaves it for interop.last_error()
        std::string text = message(wire);
        std::free(wire);
        throw std::runtime_error(text);
    }
    return reinterpret_cast<void *>(p);
}
