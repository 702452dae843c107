package device_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
	"github.com/cudacore/cudacore/pkg/device"
)

func TestVerify(t *testing.T) {
	tcc := cudasim.H100()
	tcc.Name, tcc.MemoryPoolsSupported, tcc.TCCDriver, tcc.ManagedMemory = "sim-tcc", false, true, false
	for _, tc := range []struct {
		name   string
		cfg    cudasim.DeviceConfig
		fault  string // entry point whose first call fails with NOT_SUPPORTED
		status map[string]string
	}{
		{"h100", cudasim.H100(), "", map[string]string{"memory pool": device.Verified, "pinned host memory": device.Verified,
			"managed memory": device.Verified, "virtual memory": device.NotProbed, "stack reservation": device.Verified,
			"module loading": device.Claimed}},
		{"tcc", tcc, "", map[string]string{"memory pool": device.Unsupported, "managed memory": device.Unsupported,
			"pinned host memory": device.Verified}},
		{"pool attribute lies", cudasim.H100(), "cuMemAllocFromPoolAsync", map[string]string{"memory pool": device.Fallback}},
		{"pinned refused", cudasim.H100(), "cuMemHostAlloc", map[string]string{"pinned host memory": device.Fallback}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			drv := cudasim.New(cudasim.WithDevices(tc.cfg))
			require.NoError(t, drv.Init())
			d, err := device.Open(drv, 0, "auto")
			require.NoError(t, err)
			t.Cleanup(func() { _ = d.Close() })
			if tc.fault != "" {
				drv.InjectFault(tc.fault, 1, cuda.ErrorNotSupported)
			}
			probes := map[string]device.Probe{}
			for _, p := range device.Verify(d) {
				probes[p.Name] = p
				assert.NotEmpty(t, p.Reason, p.Name)
			}
			for name, want := range tc.status {
				assert.Equal(t, want, probes[name].Status, "%s: %s", name, probes[name].Reason)
			}
			stack := probes["stack reservation"].Value
			assert.Equal(t, uint64(1024*132*2048), stack["cost_bytes"])
		})
	}
}

func TestVerifyModuleLoading(t *testing.T) {
	drv := cudasim.New()
	require.NoError(t, drv.Init())
	d, err := device.Open(drv, 0, "auto")
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	t.Setenv("CUDA_MODULE_LOADING", " eager ")
	found := false
	for _, p := range device.Verify(d) {
		if p.Name == "module loading" {
			found = true
			assert.Equal(t, "EAGER", p.Value["mode"])
			assert.Contains(t, p.Reason, "set in the environment")
		}
	}
	assert.True(t, found)
}
