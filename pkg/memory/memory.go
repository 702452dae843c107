// Package memory is cudacore's device-memory allocation layer: base resources that call the driver (a
// stream-ordered Pool, the synchronous Sync, Managed, and Pinned host memory) and adaptors that wrap any
// Resource and are Resources themselves (Stats, Limit, Retry, Tracker, Cache), composed RMM-style. Stack
// is the per-device composition the facade uses.
//
// Nothing here is global: every resource is built from a *device.Device (its driver, primary context and
// properties) and owns only what it allocated. A resource never panics on bad input; every failure is an
// error whose first *cuda.Error carries a Result, so errors.Is(err, cuda.ErrOutOfMemory) works through any
// wrapping and the facade can render it in the wire format.
//
// Ownership: the pointer Allocate returns belongs to the caller until it hands it back to Deallocate of
// the same resource (the one at the top of the composition it allocated from), with the same size. The
// stream is the one the memory is used on: stream-ordered resources may reuse a block freed on a stream
// for the next allocation on that same stream without waiting.
package memory

import (
	"fmt"
	"strconv"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/device"
)

// Resource allocates device memory. Implementations are safe for concurrent use.
//
// Allocate returns a pointer to at least size bytes usable on stream s. On failure it returns an error
// and holds nothing more than before the call. Deallocate returns p, which must come from Allocate of this
// resource with the same size; for stream-ordered resources the memory is reused only after the work
// queued on s before the call.
type Resource interface {
	Allocate(size uint64, s cuda.Stream) (cuda.DevicePtr, error)
	Deallocate(p cuda.DevicePtr, size uint64, s cuda.Stream) error
}

// Releaser is implemented by resources that hold memory they have not handed out (a cache, a pool's
// reserve). Release gives that memory back to the device and forwards to the resources below, so calling
// it on the top of a composition releases everything under it. Memory handed out is not touched.
type Releaser interface {
	Release() error
}

// Cacher is implemented by resources that hold memory they have not handed out. Cached reports those
// bytes, including what the resources below hold (adaptors forward).
type Cacher interface {
	Cached() uint64
}

// Wrapper is implemented by every adaptor: Unwrap returns the resource it wraps. Release, Cached and the
// device lookups walk compositions through it, so a user-defined adaptor that implements Unwrap composes
// with this package's helpers even if it forwards nothing.
type Wrapper interface {
	Unwrap() Resource
}

// deviceHolder is implemented by the base resources and Stack: the device they allocate on.
type deviceHolder interface {
	Device() *device.Device
}

// blockSizer is implemented by resources that round sizes up (the Cache's size classes): what one
// allocation of size really takes from the device. Admit and AllocateTiles use it to count tiles.
type blockSizer interface {
	blockSize(size uint64) uint64
}

// maxDepth bounds the walks below: a composition that wraps itself would otherwise loop forever.
const maxDepth = 64

// Release releases the cached memory of r's composition: it calls Release on the first resource in the
// chain r, r.Unwrap(), ... that implements Releaser (which forwards further down). It returns nil when
// nothing in the chain caches.
func Release(r Resource) error {
	for i := 0; r != nil && i < maxDepth; i++ {
		if rel, ok := r.(Releaser); ok {
			return rel.Release()
		}
		r = unwrap(r)
	}
	return nil
}

// Cached returns the bytes held but not handed out in r's composition: Cached of the first Cacher in the
// chain (which forwards further down), or 0.
func Cached(r Resource) uint64 {
	for i := 0; r != nil && i < maxDepth; i++ {
		if c, ok := r.(Cacher); ok {
			return c.Cached()
		}
		r = unwrap(r)
	}
	return 0
}

// DeviceOf returns the device r's composition allocates on, found by walking Unwrap to a base resource,
// or nil for a composition whose base is not from this package.
func DeviceOf(r Resource) *device.Device {
	for i := 0; r != nil && i < maxDepth; i++ {
		if h, ok := r.(deviceHolder); ok {
			return h.Device()
		}
		r = unwrap(r)
	}
	return nil
}

// blockSizeOf is what one allocation of size takes from the device through r: the first rounding found.
func blockSizeOf(r Resource, size uint64) uint64 {
	for i := 0; r != nil && i < maxDepth; i++ {
		if b, ok := r.(blockSizer); ok {
			return b.blockSize(size)
		}
		r = unwrap(r)
	}
	return size
}

func unwrap(r Resource) Resource {
	if w, ok := r.(Wrapper); ok {
		return w.Unwrap()
	}
	return nil
}

// forwardRelease is Release for adaptors that cache nothing themselves.
func forwardRelease(inner Resource) error { return Release(inner) }

// OpAllocate is the Op of errors about an allocation request itself (bad size, bad count).
const OpAllocate = "cudacore.allocate"

func u64(v uint64) string { return strconv.FormatUint(v, 10) }

func field(k string, v uint64) cuda.Field { return cuda.Field{Key: k, Value: u64(v)} }

func invalid(op, msg string, fields ...cuda.Field) *cuda.Error {
	return cuda.NewError(op, cuda.ErrorInvalidValue, msg, fields...)
}

// errZeroSize is the error for a 0-byte request: the driver would return a bare CUDA_ERROR_INVALID_VALUE.
func errZeroSize() *cuda.Error {
	return invalid(OpAllocate, "size must be positive: cannot allocate 0 bytes", field("requested", 0))
}

// checkSize rejects what the driver need not see: 0 bytes (InvalidValue), and more than the device's total
// memory (the out-of-memory error, built without a driver call, naming op as the entry point that would
// have failed).
func checkSize(d *device.Device, op string, size uint64) error {
	if size == 0 {
		return errZeroSize()
	}
	if total := d.Properties().TotalMemory; total != 0 && size > total {
		return OutOfMemory(d, size, cuda.NewError(op, cuda.ErrorOutOfMemory, ""), PoolState{})
	}
	return nil
}

// FormatBytes renders n for a person, in binary units with one decimal: "512 B", "1.0 KiB", "78.7 GiB",
// "2.0 TiB".
func FormatBytes(n uint64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return strconv.FormatUint(n, 10) + " B"
	}
	div, exp := uint64(1024), 0
	for m := n / 1024; m >= 1024 && exp < len(units)-1; m /= 1024 {
		div *= 1024
		exp++
	}
	v := float64(n) / float64(div)
	if v >= 1023.95 && exp < len(units)-1 { // would print as "1024.0": say the next unit
		v /= 1024
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", v, units[exp])
}
