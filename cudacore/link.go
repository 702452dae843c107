package cudacore

// The fast-path C entry points must be linked into the same shared library as the gopy bindings.
import _ "github.com/cudacore/cudacore/cudacore/internal/fast"
