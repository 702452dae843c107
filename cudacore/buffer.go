package cudacore

import (
	"encoding/binary"
	"fmt"

	"github.com/cudacore/cudacore/cudacore/internal/process"
	"github.com/cudacore/cudacore/pkg/cuda"
)

// The entries behind cudacore._fast's Buffer and PinnedBuffer (cudacore/native/buffer.c, pinned.c and alloc.c). A Buffer owns
// its device allocation from Allocate until one successful Free; a PinnedBuffer its host allocation from
// PinnedAllocate until one successful PinnedFree. The C objects mark themselves closed only after the
// free succeeded, so a failed free can be retried.

// Allocate allocates size bytes on device ordinal for use on stream through the device's allocator (a
// cache hit costs no driver call) and returns the device address. The stream-lifetime and capture rules
// of process.Device.Allocate apply. The owner token of an allocation made during a capture (0 for any
// other) is written into token (8 bytes, native byte order), taken with the allocation
// (process.Device.AllocateOwned): the Buffer passes it back to GraphFree.
//
//cudacore:gil device
//cudacore:door native
//cudacore:writable token
func Allocate(ordinal, size, stream int, token []byte) (int, error) {
	return guard("cudacore.allocate", func() (int, error) {
		if size <= 0 {
			return 0, cuda.NewError("cudacore.allocate", cuda.ErrorInvalidValue,
				fmt.Sprintf("size must be a positive number of bytes, got %d", size))
		}
		if len(token) != 8 {
			return 0, cuda.NewError("cudacore.allocate", cuda.ErrorInvalidValue,
				fmt.Sprintf("the token buffer must be 8 bytes, got %d", len(token)))
		}
		d, err := process.Lookup(ordinal)
		if err != nil {
			return 0, err
		}
		// Without the GIL on the synchronous strategy, as PyTorch's allocation (AllocateSteady).
		p, t, err := d.AllocateOwned(uint64(size), cuda.Stream(uint64(stream)))
		binary.NativeEndian.PutUint64(token, t)
		return int(p), err
	})
}

// Free frees what Allocate returned (size bytes at ptr), in stream order on stream; it returns 0.
//
//cudacore:gil device
//cudacore:door native
func Free(ordinal, ptr, size, stream int) (int, error) {
	return guard("cudacore.free", func() (int, error) {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return 0, err
		}
		// Without the GIL on the synchronous strategy, as PyTorch's free: Device.FreeSteady.
		return 0, d.FreeSteady(cuda.DevicePtr(uint64(ptr)), uint64(size), cuda.Stream(uint64(stream)))
	})
}

// FreeNamed is Free on a stream the caller names in this call and vouches is alive now, also one
// cudacore did not create (a cuda.core deallocation on the stream cuda.core passes): the free is ordered
// on it (process.Device.FreeNamed). It returns 0.
//
//cudacore:gil device
func FreeNamed(ordinal, ptr, size, stream int) (int, error) {
	return guard("cudacore.free", func() (int, error) {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return 0, err
		}
		return 0, d.FreeNamed(cuda.DevicePtr(uint64(ptr)), uint64(size), cuda.Stream(uint64(stream)))
	})
}

// GraphFree is Free for a Buffer allocated during a capture, which holds the owner token Allocate gave
// it: if its memory went void (the capture was aborted, or its graph destroyed before any launch), the
// free frees nothing, also when the driver has handed the address to another owner since. It returns 0.
//
//cudacore:gil device
//cudacore:door native
func GraphFree(ordinal, ptr, size, stream, token int) (int, error) {
	return guard("cudacore.free", func() (int, error) {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return 0, err
		}
		return 0, d.FreeOwned(cuda.DevicePtr(uint64(ptr)), uint64(size), cuda.Stream(uint64(stream)), uint64(token))
	})
}

// PinnedAllocate allocates size bytes of page-locked host memory for device ordinal and returns its
// address. Pinning pages can take milliseconds, so the GIL is released.
//
//cudacore:gil release
//cudacore:door native
func PinnedAllocate(ordinal, size int) (int, error) {
	return guard("cudacore.allocate_pinned", func() (int, error) {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return 0, err
		}
		addr, err := d.AllocPinned(int64(size))
		return int(addr), err
	})
}

// PinnedFree frees pinned memory from PinnedAllocate; it returns 0. collected is 1 when the owner is
// being collected: a free the driver refuses then is kept and retried by a later free or
// release_cached_memory, since no one is left to call close() again (0: the memory stays the caller's).
//
//cudacore:gil release
//cudacore:door native
func PinnedFree(ordinal, addr, collected int) (int, error) {
	return guard("cudacore.free_pinned", func() (int, error) {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return 0, err
		}
		return 0, d.FreePinned(uintptr(addr), collected != 0)
	})
}

// DLPackOrder orders a DLPack consumer's stream after the work queued so far on the buffer's stream,
// with an event recorded on the buffer's stream and waited on by the consumer's (the host does not
// wait). consumer is the DLPack stream value: -1 asks for no ordering, 0 and 1 are the legacy stream, 2
// the per-thread stream, anything else the consumer's stream handle. A buffer stream that cudacore
// destroyed is never handed to the driver: its work was finished when it was destroyed, so there is
// nothing to order. The capture rules apply to both enqueues. It returns 0.
//
//cudacore:gil hold
//cudacore:door native
func DLPackOrder(ordinal, bufferStream, consumer int) (int, error) {
	return guard("cudacore.dlpack", func() (int, error) {
		if consumer == -1 {
			return 0, nil
		}
		if consumer < -1 {
			return 0, cuda.NewError("cudacore.dlpack", cuda.ErrorInvalidValue, fmt.Sprintf(
				"__dlpack__: stream must be -1, 1, 2 or a CUDA stream handle, got %d", consumer))
		}
		d, err := process.Lookup(ordinal)
		if err != nil {
			return 0, err
		}
		return 0, d.Order("dlpack", cuda.Stream(uint64(consumer)), cuda.Stream(uint64(bufferStream)))
	})
}

// CheckDLPackExport refuses the DLPack export of size bytes at device address ptr of the device at ordinal
// when they are graph memory of a graph that was never launched (no memory is behind them yet: an
// IllegalStateError). The direct path calls it only while such memory exists. It returns 0.
//
//cudacore:gil hold
//cudacore:door native
func CheckDLPackExport(ordinal, ptr, size int) (int, error) {
	return guard("cudacore.dlpack", func() (int, error) {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return 0, err
		}
		return 0, d.Streams().CheckGraphMemoryExport("dlpack", cuda.DevicePtr(uint64(ptr)), uint64(max(size, 0)))
	})
}

// BufferExportStream returns the stream that a consumer of the Buffer at ptr, allocated on the stream
// handle given, may order its use after (the CUDA Array Interface's "stream"), or -1 when none is needed:
// the stream is destroyed, or another library's that nobody vouches for any more (the device is then
// synchronized first). See process.Device.ExportStream.
//
//cudacore:gil release
func BufferExportStream(ordinal, ptr, handle int) (int, error) {
	return guard("cudacore.cuda_array_interface", func() (int, error) {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return 0, err
		}
		s, ok, err := d.ExportStream(cuda.DevicePtr(uint64(ptr)), cuda.Stream(uint64(handle)))
		if err != nil || !ok {
			return -1, err
		}
		return int(uint64(s)), nil
	})
}
