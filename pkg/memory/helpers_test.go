package memory

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
	"github.com/cudacore/cudacore/pkg/device"
)

const (
	KiB = uint64(1) << 10
	MiB = uint64(1) << 20
	GiB = uint64(1) << 30
)

// openSim opens device 0 of a fresh simulator (one H100 unless cfgs say otherwise).
func openSim(t testing.TB, cfgs ...cudasim.DeviceConfig) (*cudasim.Driver, *device.Device) {
	t.Helper()
	var opts []cudasim.Option
	if len(cfgs) > 0 {
		opts = append(opts, cudasim.WithDevices(cfgs...))
	}
	drv := cudasim.New(opts...)
	d, err := device.Open(drv, 0, "")
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return drv, d
}

// small is a 1 GiB device with pools: the simulator holds back 64 MiB of it, so 960 MiB are free.
func small(name string) cudasim.DeviceConfig {
	c := cudasim.H100()
	c.Name = name
	c.TotalMemory = GiB
	return c
}

func newStack(t testing.TB, d *device.Device, opts StackOptions) *Stack {
	t.Helper()
	s, err := NewStack(d, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func freeMem(t testing.TB, d *device.Device) uint64 {
	t.Helper()
	f, _, err := d.MemoryInfo()
	require.NoError(t, err)
	return f
}

func newStream(t testing.TB, drv cuda.Driver, d *device.Device) cuda.Stream {
	t.Helper()
	s, err := drv.StreamCreate(d.Context(), cuda.StreamNonBlocking, 0)
	require.NoError(t, err)
	return s
}

func asCUDA(t testing.TB, err error) *cuda.Error {
	t.Helper()
	require.Error(t, err)
	var e *cuda.Error
	require.ErrorAs(t, err, &e)
	return e
}

// fakeRes is an in-memory Resource for the fuzzers: sizes divisible by oomEvery fail with out of memory
// and by badEvery with InvalidValue; it checks that nothing is freed twice or with the wrong size.
type fakeRes struct {
	mu       sync.Mutex
	next     uint64
	live     map[cuda.DevicePtr]uint64
	oomEvery uint64
	badEvery uint64
	errs     []string
}

func newFake() *fakeRes {
	return &fakeRes{next: 1 << 40, live: map[cuda.DevicePtr]uint64{}, oomEvery: 7, badEvery: 11}
}

func (f *fakeRes) Allocate(size uint64, _ cuda.Stream) (cuda.DevicePtr, error) {
	switch {
	case size == 0:
		return 0, errZeroSize()
	case f.oomEvery != 0 && size%f.oomEvery == 0:
		return 0, cuda.NewError("fake", cuda.ErrorOutOfMemory, "")
	case f.badEvery != 0 && size%f.badEvery == 0:
		return 0, cuda.NewError("fake", cuda.ErrorInvalidValue, "")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p := cuda.DevicePtr(f.next)
	f.next += size
	f.live[p] = size
	return p, nil
}

func (f *fakeRes) Deallocate(p cuda.DevicePtr, size uint64, _ cuda.Stream) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.live[p]
	if !ok || s != size {
		f.errs = append(f.errs, fmt.Sprintf("bad free %#x size %d (live %v)", uint64(p), size, ok))
		return cuda.NewError("fake", cuda.ErrorInvalidValue, "bad free")
	}
	delete(f.live, p)
	return nil
}

func (f *fakeRes) liveBytes() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var n uint64
	for _, s := range f.live {
		n += s
	}
	return n
}
