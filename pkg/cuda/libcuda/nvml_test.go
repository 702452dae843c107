package libcuda

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// NVML is optional: without libnvidia-ml, or for a device it does not know, the answer is "not available",
// never a crash, so callers fall back to their own estimate.
func TestOtherProcessesUnknownDevice(t *testing.T) {
	for _, bus := range []string{"ffff:ff:1f.7", "", "not a bus id"} {
		procs, ok := OtherProcesses(bus)
		assert.False(t, ok, bus)
		assert.Empty(t, procs, bus)
	}
}
