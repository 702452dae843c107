package conformance_test

import (
	"errors"
	"os"
	"testing"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cuda/conformance"
	"github.com/cudacore/cudacore/pkg/cuda/libcuda"
)

// TestRealDriver runs the suite on the machine's CUDA driver (CUDACORE_LIBCUDA names the library;
// default libcuda.so.1) and skips where there is no driver or no device.
func TestRealDriver(t *testing.T) {
	d, err := libcuda.Open(os.Getenv("CUDACORE_LIBCUDA"))
	if errors.Is(err, cuda.ErrDriverNotFound) {
		t.Skipf("no CUDA driver: %v", err)
	}
	if err != nil {
		t.Fatalf("libcuda.Open: %v", err)
	}
	if err := d.Init(); err != nil {
		t.Skipf("cuInit failed (no usable device?): %v", err)
	}
	if n, err := d.DeviceCount(); err != nil || n == 0 {
		t.Skipf("no CUDA device (count %d, %v)", n, err)
	}
	conformance.Run(t, func(t *testing.T) cuda.Driver { return d })
}
