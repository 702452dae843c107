package cudacore

import (
	"fmt"
	"unsafe"

	"github.com/cudacore/cudacore/cudacore/internal/process"
	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/stream"
)

// Copies take host memory as (address, length): Python reads them off the buffer protocol (a
// memoryview, numpy's __array_interface__, PinnedBuffer.ptr) and keeps the object alive for the call.
// Each copy comes twice, with the same body: a GIL-releasing function for synchronous and large copies,
// and a "Held" one that keeps the GIL, for small asynchronous copies where releasing it would cost more
// than the copy (python/cudacore/_copy.py picks).
//
// Lifetimes: synchronous copies are done when they return. An asynchronous copy of pinned memory reads or
// writes it when the stream gets there: the caller keeps it alive and unchanged until then. Pageable
// memory is staged through pinned buffers (see pkg/stream), so the caller's memory is free to go when an
// asynchronous copy from it returns.

// hostBytes views n bytes of host memory at addr as a []byte, without copying. It is the one place that
// turns an address from Python into Go memory. addr must point at n readable (and, for device-to-host
// copies, writable) bytes that stay alive for the whole use of the slice: Python guarantees that for the
// duration of the call; the copy functions' doc comments say what holds after it returns. The memory is
// never Go-managed, so the garbage collector neither moves nor frees it.
func hostBytes(op string, addr, hostLen, n int) ([]byte, error) {
	if n < 0 {
		return nil, cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf("the copy size must be >= 0 bytes, got %d", n))
	}
	if hostLen < n {
		return nil, cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf(
			"the host buffer holds %d bytes but the copy needs %d; pass a host buffer of at least %d bytes, or copy fewer", hostLen, n, n))
	}
	if n == 0 {
		return nil, nil
	}
	if addr == 0 {
		return nil, cuda.NewError(op, cuda.ErrorInvalidValue, "the host buffer's address is NULL")
	}
	// Go's unsafe rules: an address held in an int is turned back into a pointer through memory, not by
	// conversion, since it points outside the Go heap (go vet's unsafeptr check).
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), n), nil
}

// copyStream resolves the stream argument of a copy: -1 is synchronous (nil).
func copyStream(op string, ordinal, handle int) (*stream.Manager, *stream.Stream, error) {
	if handle == -1 {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return nil, nil, err
		}
		return d.Streams(), nil, nil
	}
	d, s, err := streamOf(op, ordinal, handle)
	if err != nil {
		return nil, nil, err
	}
	return d.Streams(), s, nil
}

func devPtr(op string, p int) (cuda.DevicePtr, error) {
	if p == 0 {
		return 0, cuda.NewError(op, cuda.ErrorInvalidValue, "the device address is NULL")
	}
	return cuda.DevicePtr(uint64(p)), nil
}

func copyHtoD(ordinal, dst, host, hostLen, n, streamHandle int) (int, error) {
	const op = "cudacore.copy_from"
	b, err := hostBytes(op, host, hostLen, n)
	if err != nil {
		return 0, err
	}
	m, s, err := copyStream(op, ordinal, streamHandle)
	if err != nil {
		return 0, err
	}
	p, err := devPtr(op, dst)
	if err != nil {
		return 0, err
	}
	return n, m.CopyHtoD(p, b, s)
}

func copyDtoH(ordinal, host, hostLen, src, n, streamHandle int) (int, error) {
	const op = "cudacore.copy_to"
	b, err := hostBytes(op, host, hostLen, n)
	if err != nil {
		return 0, err
	}
	m, s, err := copyStream(op, ordinal, streamHandle)
	if err != nil {
		return 0, err
	}
	p, err := devPtr(op, src)
	if err != nil {
		return 0, err
	}
	return n, m.CopyDtoH(b, p, s)
}

func copyDtoD(ordinal, dst, src, n, streamHandle int) (int, error) {
	const op = "cudacore.copy"
	if n < 0 {
		return 0, cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf("the copy size must be >= 0 bytes, got %d", n))
	}
	m, s, err := copyStream(op, ordinal, streamHandle)
	if err != nil {
		return 0, err
	}
	d, err := devPtr(op, dst)
	if err != nil {
		return 0, err
	}
	sp, err := devPtr(op, src)
	if err != nil {
		return 0, err
	}
	return n, m.CopyDtoD(d, sp, uint64(n), s)
}

// CopyHtoD copies n bytes of host memory at host (hostLen bytes long) to device address dst of the
// device at ordinal, on a stream (-1: synchronously). It returns n.
//
//cudacore:gil release
func CopyHtoD(ordinal, dst, host, hostLen, n, streamHandle int) (int, error) {
	return guard("cudacore.copy_from", func() (int, error) { return copyHtoD(ordinal, dst, host, hostLen, n, streamHandle) })
}

// CopyHtoDHeld is CopyHtoD keeping the GIL, for small asynchronous copies.
//
//cudacore:gil hold
func CopyHtoDHeld(ordinal, dst, host, hostLen, n, streamHandle int) (int, error) {
	return guard("cudacore.copy_from", func() (int, error) { return copyHtoD(ordinal, dst, host, hostLen, n, streamHandle) })
}

// CopyDtoH copies n bytes from device address src into host memory at host (hostLen bytes long, writable),
// on a stream (-1: synchronously). It returns n.
//
//cudacore:gil release
func CopyDtoH(ordinal, host, hostLen, src, n, streamHandle int) (int, error) {
	return guard("cudacore.copy_to", func() (int, error) { return copyDtoH(ordinal, host, hostLen, src, n, streamHandle) })
}

// CopyDtoHHeld is CopyDtoH keeping the GIL, for small asynchronous copies into pinned memory.
//
//cudacore:gil hold
func CopyDtoHHeld(ordinal, host, hostLen, src, n, streamHandle int) (int, error) {
	return guard("cudacore.copy_to", func() (int, error) { return copyDtoH(ordinal, host, hostLen, src, n, streamHandle) })
}

// CopyDtoD copies n bytes between device addresses of one device, on a stream (-1: synchronously). It
// returns n.
//
//cudacore:gil release
func CopyDtoD(ordinal, dst, src, n, streamHandle int) (int, error) {
	return guard("cudacore.copy", func() (int, error) { return copyDtoD(ordinal, dst, src, n, streamHandle) })
}

// CopyDtoDHeld is CopyDtoD keeping the GIL, for asynchronous copies (they only enqueue).
//
//cudacore:gil hold
func CopyDtoDHeld(ordinal, dst, src, n, streamHandle int) (int, error) {
	return guard("cudacore.copy", func() (int, error) { return copyDtoD(ordinal, dst, src, n, streamHandle) })
}
