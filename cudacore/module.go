package cudacore

import (
	"encoding/base64"
	"encoding/json"

	"github.com/cudacore/cudacore/cudacore/internal/kernels"
	"github.com/cudacore/cudacore/cudacore/internal/process"
	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/module"
)

// ModuleLoad loads a kernel image (PTX, cubin or fatbin), given base64-encoded, into the device at
// ordinal and returns a module handle. Base64, because gopy passes strings as C strings: raw image bytes
// hold NULs. Loading PTX compiles it, which can take long: the GIL is released.
//
//cudacore:gil release
func ModuleLoad(ordinal int, imageBase64 string) (int, error) {
	return guard("cudacore.load_module", func() (int, error) {
		image, err := base64.StdEncoding.DecodeString(imageBase64)
		if err != nil {
			return 0, cuda.NewError("cudacore.load_module", cuda.ErrorInvalidValue,
				"the image is not valid base64: "+err.Error())
		}
		d, err := process.GetDevice(ordinal)
		if err != nil {
			return 0, err
		}
		lim, err := module.QueryDeviceLimits(d.Driver(), d.Handle(), ordinal)
		if err != nil {
			return 0, err
		}
		m, err := module.Load(d.Driver(), d.Context(), lim, image)
		if err != nil {
			return 0, err
		}
		return int(kernels.Default.AddModule(m, ordinal)), nil
	})
}

// ModuleInfo returns JSON {kind, device, entries: [{name, params: [...]}] or null for a binary image}.
//
//cudacore:gil hold
func ModuleInfo(handle int) (string, error) {
	return guard("cudacore.module_info", func() (string, error) {
		m, err := kernels.Default.Module(int64(handle))
		if err != nil {
			return "", err
		}
		b, err := json.Marshal(map[string]any{"kind": m.Kind(), "device": m.Ordinal, "entries": m.Entries()})
		return string(b), err
	})
}

// ModuleUnload unloads the module and forgets it and its functions; it returns 0.
//
//cudacore:gil release
func ModuleUnload(handle int) (int, error) {
	return guard("cudacore.module_unload", func() (int, error) {
		return 0, kernels.Default.Unload(int64(handle))
	})
}

// ModuleFunction looks up a kernel by name in the module and returns a function handle. With lazy module
// loading (the default since CUDA 12.2) this is when the kernel's code is loaded: the GIL is released.
//
//cudacore:gil release
func ModuleFunction(handle int, name string) (int, error) {
	return guard("cudacore.module_function", func() (int, error) {
		h, err := kernels.Default.Function(int64(handle), name)
		return int(h), err
	})
}

// FunctionInfo returns JSON {name, attributes: {...}, params: [...], params_known}. params come from the
// PTX declaration; params_known is false for kernels of binary images.
//
//cudacore:gil hold
func FunctionInfo(handle int) (string, error) {
	return guard("cudacore.function_info", func() (string, error) {
		f, err := kernels.Default.Func(int64(handle))
		if err != nil {
			return "", err
		}
		params, known := f.Params()
		if params == nil {
			params = []module.Param{}
		}
		b, err := json.Marshal(map[string]any{"name": f.Name(), "attributes": f.Attributes(),
			"params": params, "params_known": known})
		return string(b), err
	})
}

func dim3(x, y, z int, what string) (cuda.Dim3, error) {
	var d cuda.Dim3
	for i, v := range []int{x, y, z} {
		if v < 0 || v > 1<<32-1 {
			return d, cuda.NewError("cudacore.launch", cuda.ErrorInvalidValue,
				what+" dimensions must be between 1 and 4,294,967,295")
		}
		d[i] = uint32(v)
	}
	return d, nil
}

// FunctionLaunch launches the kernel asynchronously on stream (a driver stream handle; 0 is the legacy
// default stream). args holds the arguments packed once by the caller (module.UnpackArgs): no text
// crosses. The configuration and arguments are validated before the driver is called. It returns the
// driver's function handle when the kernel's parameters are known, for the direct path, and 0 otherwise.
//
//cudacore:gil hold
//cudacore:door hot
func FunctionLaunch(handle, gx, gy, gz, bx, by, bz, sharedMem, stream int, args []byte) (int, error) {
	return guard("cudacore.launch", func() (int, error) {
		f, err := kernels.Default.Func(int64(handle))
		if err != nil {
			return 0, err
		}
		grid, err := dim3(gx, gy, gz, "grid")
		if err != nil {
			return 0, err
		}
		block, err := dim3(bx, by, bz, "block")
		if err != nil {
			return 0, err
		}
		if sharedMem < 0 || sharedMem > 1<<32-1 {
			return 0, cuda.NewError("cudacore.launch", cuda.ErrorInvalidValue,
				"shared_mem must be between 0 and 4,294,967,295 bytes")
		}
		a, err := module.UnpackArgs(args)
		if err != nil {
			return 0, err
		}
		d, err := process.Lookup(f.Ordinal)
		if err != nil {
			return 0, err
		}
		h, streams := cuda.Stream(uintptr(stream)), d.Streams()
		if streams.PendingUsePossible() || process.Capturing() {
			ptrs := module.Pointers(a)
			// Graph memory no launch made real has no memory behind it.
			if err := streams.CheckGraphMemoryUse("launch", h, ptrs); err != nil {
				return 0, err
			}
			streams.NoteUses(h, ptrs) // if h captures, its graph keeps the memory it uses alive
		}
		// A destroyed stream's handle must never reach the driver: EnqueueOn refuses it, and holds the
		// stream around the launch only, not across the handling of a capture failure (which takes it
		// again).
		err = streams.EnqueueOn("launch", h, func() error {
			return f.Launch(module.Config{Grid: grid, Block: block, SharedMem: uint32(sharedMem), Stream: h}, a)
		})
		if err != nil || !f.ParamsKnown() {
			return 0, err
		}
		// The driver's function handle, for the direct path (cudacore/direct.go) to launch with arguments
		// packed by the kernel's known parameters; its module's unload stops that first.
		return int(uint64(f.Handle())), nil
	})
}
