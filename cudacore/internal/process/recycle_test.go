package process

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/cudacore/internal/recycle"
	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/memory"
)

// recycleDevice opens device 0 on the simulator with logging allowed, the log empty and the allocator
// holding nothing.
func recycleDevice(t *testing.T) *Device {
	d := simDevice(t)
	require.Zero(t, d.Memory().Stats().InUse, "an earlier test left memory allocated")
	Publish()
	require.NotZero(t, recycle.Allowed(0), "the default allocator caches, so C may log")
	t.Cleanup(func() { Replay(); Publish() })
	return d
}

// What C served is, after Replay, in the statistics and the recorder as if each call had entered Go:
// a free and an allocation of the same block for a free that was taken again, a real free (the block
// back in the cache) for one that was not.
func TestReplayAccountsForEveryLoggedCall(t *testing.T) {
	d := recycleDevice(t)
	m := d.Memory()
	p, err := d.Allocate(4096, cuda.StreamLegacy)
	require.NoError(t, err)
	q, err := d.Allocate(8192, cuda.StreamLegacy)
	require.NoError(t, err)
	before := m.Stats()
	_, seq := Recorder.Since(0, 1)

	require.True(t, recycle.LogFree(0, p, 4096, cuda.StreamLegacy))
	require.Equal(t, p, recycle.LogTake(0, 4096, cuda.StreamLegacy))
	require.True(t, recycle.LogFree(0, q, 8192, cuda.StreamLegacy))
	assert.Equal(t, before, m.Stats(), "nothing reaches the allocator before the replay")

	Replay()
	after := m.Stats()
	assert.Equal(t, before.Allocations+1, after.Allocations)
	assert.Equal(t, before.Frees+2, after.Frees)
	assert.Equal(t, before.InUse-8192, after.InUse, "p is in use again, q is freed")

	events, _ := Recorder.Since(seq, 0)
	require.Len(t, events, 3)
	want := []struct {
		kind  memory.EventKind
		ptr   cuda.DevicePtr
		inUse uint64
	}{
		{memory.EventFree, p, before.InUse - 4096},
		{memory.EventAlloc, p, before.InUse},
		{memory.EventFree, q, before.InUse - 8192},
	}
	for i, w := range want {
		assert.Equal(t, w.kind, events[i].Kind, "event %d", i)
		assert.Equal(t, w.ptr, events[i].Ptr, "event %d", i)
		assert.Equal(t, w.inUse, events[i].InUse, "event %d", i)
	}

	// q went back to the cache: the next allocation of its size gets it from Go.
	q2, err := d.Allocate(8192, cuda.StreamLegacy)
	require.NoError(t, err)
	assert.Equal(t, q, q2)
	require.NoError(t, d.Free(q2, 8192, cuda.StreamLegacy))
	require.NoError(t, d.Free(p, 4096, cuda.StreamLegacy))
	assert.Zero(t, m.Stats().InUse)
}

// Publish stops logging while a stream captures, and while allocations are tracked; it allows no block
// larger than the cache keeps.
func TestPublishFollowsTheAllocatorsState(t *testing.T) {
	d := recycleDevice(t)
	assert.Equal(t, d.Memory().Cache().MaxBlock(), recycle.Allowed(0))

	s, err := d.Streams().Create(true, 0)
	require.NoError(t, err)
	defer func() { _ = s.Destroy() }()
	require.NoError(t, s.BeginCapture(cuda.CaptureModeRelaxed))
	Publish()
	assert.Zero(t, recycle.Allowed(0), "a stream captures")
	g, err := s.EndCapture()
	require.NoError(t, err)
	defer func() { _ = g.Destroy() }()
	Publish()
	assert.NotZero(t, recycle.Allowed(0), "the capture ended")

	require.NoError(t, d.SetStrategy("pool", memory.StackOptions{Track: true}))
	Publish()
	assert.Zero(t, recycle.Allowed(0), "allocations are tracked")
	require.NoError(t, d.SetStrategy("pool", memory.StackOptions{}))
	Publish()
	assert.NotZero(t, recycle.Allowed(0))
}
