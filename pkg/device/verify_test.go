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

// The peer-access probe reads the driver's peer matrix (cudacore has enable_peer_access): it names the
// devices reachable directly, and never says that cudacore has no peer-access API.
func TestVerifyPeerAccess(t *testing.T) {
	far := cudasim.H100()
	far.PeerGroup = 1
	drv := cudasim.New(cudasim.WithDevices(cudasim.H100(), cudasim.H100(), far))
	require.NoError(t, drv.Init())
	for ordinal, want := range map[int][]int{0: {1}, 1: {0}, 2: {}} {
		d, err := device.Open(drv, ordinal, "auto")
		require.NoError(t, err)
		var peer device.Probe
		for _, p := range device.Verify(d) {
			if p.Name == "peer access" {
				peer = p
			}
		}
		require.NoError(t, d.Close())
		assert.Equal(t, device.Claimed, peer.Status, "device %d: %s", ordinal, peer.Reason)
		require.NotNil(t, peer.Claimed)
		assert.Equal(t, len(want) > 0, *peer.Claimed, "device %d", ordinal)
		assert.Equal(t, want, peer.Value["peers"], "device %d", ordinal)
		assert.NotContains(t, peer.Reason, "no peer-access API")
	}

	one := cudasim.New(cudasim.WithDevices(cudasim.H100()))
	require.NoError(t, one.Init())
	d, err := device.Open(one, 0, "auto")
	require.NoError(t, err)
	defer func() { _ = d.Close() }()
	for _, p := range device.Verify(d) {
		if p.Name == "peer access" {
			assert.Equal(t, device.NotProbed, p.Status)
			assert.Equal(t, "one device: there is no peer to reach", p.Reason)
		}
	}
}
