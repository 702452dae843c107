package cudacore

import (
	"fmt"
	"sync"

	"github.com/cudacore/cudacore/cudacore/internal/process"
	"github.com/cudacore/cudacore/pkg/cuda"
)

// The entries behind the allocator PyTorch's CUDAPluggableAllocator loads (cudacore/native/torch_shim.cc
// calls them; it is the C door, with the same fork check). PyTorch's signatures have no room for an
// error, so a failure is also recorded for InteropLastError, and the shim throws the C++ exception that
// PyTorch turns into RuntimeError.

var (
	interopMu  sync.Mutex
	interopErr string
)

func recordInterop(err error) error {
	if err != nil {
		interopMu.Lock()
		interopErr = cuda.Encode(err)
		interopMu.Unlock()
	}
	return err
}

// TorchMalloc allocates size bytes on device for use on stream through cudacore's allocator for that
// device (its pool, cache, limit and statistics) and returns the device address; a size of 0 returns 0.
//
//cudacore:gil hold
//cudacore:door native
func TorchMalloc(size, device, stream int) (int, error) {
	return guard("cudacore.torch_malloc", func() (int, error) {
		if size <= 0 {
			if size < 0 {
				return 0, recordInterop(cuda.NewError("cudacore.torch_malloc", cuda.ErrorInvalidValue,
					fmt.Sprintf("size must be >= 0, got %d", size)))
			}
			return 0, nil
		}
		d, err := process.Lookup(device)
		if err != nil {
			return 0, recordInterop(err)
		}
		st := cuda.Stream(uint64(stream))
		d.LibraryAllocates(st)
		p, err := d.AllocateSteady(uint64(size), st) // PyTorch calls without the GIL
		if err != nil {
			return 0, recordInterop(err)
		}
		process.TorchAllocations.Add(p, process.Allocation{Ordinal: device, Size: uint64(size), Stream: st})
		if d.Memory().Tracking() {
			d.Memory().Label(p, "PyTorch (cudacore.interop.torch_allocator)")
		}
		return int(p), nil
	})
}

// LibraryAllocates tells cudacore that another library's allocator (CuPy's or Numba's, from
// cudacore.interop) allocates on device ordinal, on stream (that library's handle; 0: not known): the
// devices such allocators use get peer access to each other's memory, pools included
// (process.Device.LibraryAllocates). It returns 1 once that is done for the device, 0 while it is not (a
// capture runs: a later call does it).
//
//cudacore:gil release
func LibraryAllocates(ordinal, stream int) (int, error) {
	return guard("cudacore.interop", func() (int, error) {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return 0, err
		}
		if d.LibraryAllocates(cuda.Stream(uint64(stream))) {
			return 1, nil
		}
		return 0, nil
	})
}

// TorchFree frees what TorchMalloc returned, in stream order on the stream it was allocated on; a null
// pointer is ignored, a pointer TorchMalloc did not return is refused and left alone. It returns 0.
//
//cudacore:gil hold
//cudacore:door native
func TorchFree(ptr int) (int, error) {
	return guard("cudacore.torch_free", func() (int, error) {
		if ptr == 0 {
			return 0, nil
		}
		a, ok := process.TorchAllocations.Take(cuda.DevicePtr(uint64(ptr)))
		if !ok {
			return 0, recordInterop(cuda.NewError("cudacore.torch_free", cuda.ErrorInvalidValue,
				fmt.Sprintf("%#x was not allocated by cudacore's PyTorch allocator (or was freed already); not freed", uintptr(ptr))))
		}
		d, err := process.Lookup(a.Ordinal)
		if err != nil {
			return 0, recordInterop(err)
		}
		// PyTorch's free names the allocation's stream, which PyTorch keeps alive (its streams come from a
		// pool it never destroys; an ExternalStream's user must keep it alive while tensors use it).
		return 0, recordInterop(d.FreeNamed(cuda.DevicePtr(uint64(ptr)), a.Size, a.Stream))
	})
}

// TorchLive returns how many allocations made by TorchMalloc are alive.
//
//cudacore:gil hold
func TorchLive() (int, error) {
	return guard("cudacore.torch_live", func() (int, error) {
		return process.TorchAllocations.Len(), nil
	})
}

// InteropLastError returns the last error the framework allocator entries recorded, in the wire format,
// and forgets it; "" when there is none.
//
//cudacore:gil hold
func InteropLastError() (string, error) {
	return guard("cudacore.interop_last_error", func() (string, error) {
		interopMu.Lock()
		defer interopMu.Unlock()
		s := interopErr
		interopErr = ""
		return s, nil
	})
}

// WireMessage returns the sentence a person reads from a wire-format error text (the text itself when it
// is not in the format). The PyTorch shim puts it in its exception, so that the wire grammar is parsed in
// Go and Python only.
//
//cudacore:gil hold
//cudacore:door native
func WireMessage(wire string) (string, error) {
	return guard("cudacore.wire_message", func() (string, error) {
		if w, ok := cuda.Decode(wire); ok {
			return w.Message, nil
		}
		return wire, nil
	})
}
