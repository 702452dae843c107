package device_test

import (
	"errors"
	"testing"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
	"github.com/cudacore/cudacore/pkg/device"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestQueryReadsTheSimulatedH100(t *testing.T) {
	drv := cudasim.New()
	n, err := device.Count(drv)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	p, err := device.Query(drv, 0)
	require.NoError(t, err)
	assert.Equal(t, "NVIDIA H100 80GB HBM3", p.Name)
	assert.Equal(t, uint64(85_017_493_504), p.TotalMemory)
	assert.Equal(t, [2]int{9, 0}, p.ComputeCapability)
	assert.True(t, p.MemoryPoolsSupported)
	assert.False(t, p.TCCDriver)
	assert.True(t, p.ManagedMemory)
	assert.False(t, p.Integrated)
	assert.Equal(t, 13000, p.DriverVersion)
	assert.Regexp(t, `^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`, p.UUID)
	assert.Equal(t, 1024, p.MaxThreadsPerBlock)
}

func TestBadOrdinals(t *testing.T) {
	drv := cudasim.New(cudasim.WithDevices(cudasim.H100(), cudasim.H100()))
	for _, ordinal := range []int{-1, 2, 1 << 30} {
		_, err := device.Query(drv, ordinal)
		require.Error(t, err, ordinal)
		assert.ErrorIs(t, err, cuda.ErrInvalidValue)
		assert.Contains(t, err.Error(), "valid ordinals are 0 to 1")
	}
	assert.Contains(t, device.CheckOrdinal(3, 1).Error(), "the only device is 0")
	assert.Contains(t, device.CheckOrdinal(0, 0).Error(), "there are no devices")
}

func TestChoose(t *testing.T) {
	h100 := device.Properties{MemoryPoolsSupported: true, DriverVersion: 13000}
	tcc := device.Properties{MemoryPoolsSupported: true, TCCDriver: true, DriverVersion: 13000}
	noPools := device.Properties{DriverVersion: 13000}
	oldDriver := device.Properties{MemoryPoolsSupported: true, DriverVersion: 11010}
	cases := []struct {
		name      string
		props     device.Properties
		requested string
		want      device.Strategy
		reason    string
		err       error
	}{
		{"pools", h100, "", device.StrategyPool, "MEMORY_POOLS_SUPPORTED=1", nil},
		{"auto", h100, "AUTO", device.StrategyPool, "MEMORY_POOLS_SUPPORTED=1", nil},
		{"tcc", tcc, "", device.StrategySync, "TCC", nil},
		{"no pools", noPools, "", device.StrategySync, "MEMORY_POOLS_SUPPORTED=0", nil},
		{"old driver", oldDriver, "", device.StrategySync, "older than 11.2", nil},
		{"sync asked", h100, "sync", device.StrategySync, "requested explicitly", nil},
		{"pool asked", h100, " pool ", device.StrategyPool, "requested explicitly", nil},
		{"pool asked on tcc", tcc, "pool", "", "", cuda.ErrNotSupported},
		{"pool asked without pools", noPools, "pool", "", "", cuda.ErrNotSupported},
		{"unknown", h100, "fast", "", "", cuda.ErrInvalidValue},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, why, err := device.Choose(c.props, c.requested)
			if c.err != nil {
				require.Error(t, err)
				assert.True(t, errors.Is(err, c.err), err)
				// Nothing falls back when the user asked for something specific: the message must not say so.
				assert.NotContains(t, err.Error(), "falls back")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
			assert.Contains(t, why, c.reason)
			assert.Regexp(t, `\.$`, why, "a reason is a sentence")
		})
	}
}

func TestOpenRetainsAndCloseReleases(t *testing.T) {
	devs := []cudasim.DeviceConfig{cudasim.H100(), cudasim.H100()}
	devs[1].Name, devs[1].MemoryPoolsSupported, devs[1].TCCDriver = "sim-tcc", false, true
	drv := cudasim.New(cudasim.WithDevices(devs...))
	d, err := device.Open(drv, 1, "")
	require.NoError(t, err)
	assert.Equal(t, device.StrategySync, d.Strategy())
	assert.Equal(t, "device 1 (sim-tcc)", d.String())
	free, total, err := d.MemoryInfo()
	require.NoError(t, err)
	assert.LessOrEqual(t, free, total)
	require.NoError(t, d.SetStrategy("sync"))
	assert.ErrorIs(t, d.SetStrategy("pool"), cuda.ErrNotSupported)
	require.NoError(t, d.Close())
	require.NoError(t, d.Close(), "Close is idempotent")
	_, err = device.Open(drv, 5, "")
	assert.ErrorIs(t, err, cuda.ErrInvalidValue)
	_, err = device.Open(drv, 0, "bogus")
	assert.ErrorIs(t, err, cuda.ErrInvalidValue)
}
