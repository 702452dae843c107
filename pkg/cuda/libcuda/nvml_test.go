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

// The link query answers "not available" for devices NVML does not know (or without NVML), never a crash.
func TestLinkBetweenUnknownDevices(t *testing.T) {
	for _, c := range [][2]string{{"ffff:ff:1f.7", "ffff:ff:1f.6"}, {"", ""}, {"not a bus id", "0000:18:00.0"}} {
		link, ok := LinkBetween(c[0], c[1])
		assert.False(t, ok, c)
		assert.Equal(t, Link{}, link, c)
	}
}
