package cudacore

// The C entry points other frameworks load (PyTorch's CUDAPluggableAllocator) and the DLPack helpers must
// be linked into the same shared library as the gopy bindings: one Go runtime per process.
import _ "github.com/cudacore/cudacore/cudacore/internal/interop"
