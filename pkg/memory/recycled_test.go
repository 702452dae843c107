package memory

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// Stack.Recycled counts a run of frees and allocations made outside the stack exactly as Deallocate and
// Allocate would have, and records each, in order, with the bytes in use after it.
func TestStackRecycledCountsAndRecordsEachOp(t *testing.T) {
	_, d := openSim(t)
	rec := NewRecorder(64)
	s := newStack(t, d, StackOptions{Recorder: rec})
	p, err := s.Allocate(4096, cuda.StreamLegacy)
	require.NoError(t, err)
	q, err := s.Allocate(8192, cuda.StreamLegacy)
	require.NoError(t, err)
	before := s.Stats()
	_, seq := rec.Since(0, 1)

	s.Recycled([]Recycle{
		{Free: true, Ptr: q, Size: 8192, Stream: cuda.StreamLegacy},
		{Free: false, Ptr: q, Size: 8192, Stream: cuda.StreamLegacy},
		{Free: true, Ptr: p, Size: 4096, Stream: cuda.StreamLegacy},
		{Free: false, Ptr: p, Size: 4096, Stream: cuda.StreamLegacy},
		{Free: true, Ptr: p, Size: 4096, Stream: cuda.StreamLegacy},
	})
	after := s.Stats()
	assert.Equal(t, before.Allocations+2, after.Allocations)
	assert.Equal(t, before.Frees+3, after.Frees)
	assert.Equal(t, before.Recycled+2, after.Recycled)
	assert.Equal(t, before.InUse-4096, after.InUse)
	assert.Equal(t, before.PeakInUse, after.PeakInUse, "the run never went above where it started")
	assert.Equal(t, before.Failures, after.Failures)

	events, _ := rec.Since(seq, 0)
	require.Len(t, events, 5)
	kinds := []EventKind{EventFree, EventAlloc, EventFree, EventAlloc, EventFree}
	inUse := []uint64{12288 - 8192, 12288, 12288 - 4096, 12288, 12288 - 4096}
	for i, e := range events {
		assert.Equal(t, kinds[i], e.Kind, "event %d", i)
		assert.Equal(t, before.InUse-12288+inUse[i], e.InUse, "event %d", i)
		assert.Equal(t, seq+uint64(i)+1, e.Seq, "event %d", i)
	}

	require.NoError(t, s.Deallocate(q, 8192, cuda.StreamLegacy))
	assert.Equal(t, before.InUse-12288, s.Stats().InUse)
}

// A run that allocates before it frees raises the peak by what it held at its highest.
func TestStackRecycledRaisesThePeak(t *testing.T) {
	_, d := openSim(t)
	s := newStack(t, d, StackOptions{})
	s.ResetPeak()
	base := s.Stats().InUse
	s.Recycled([]Recycle{
		{Free: false, Ptr: 0x1000, Size: 100},
		{Free: false, Ptr: 0x2000, Size: 50},
		{Free: true, Ptr: 0x1000, Size: 100},
		{Free: true, Ptr: 0x2000, Size: 50},
	})
	assert.Equal(t, base+150, s.Stats().PeakInUse)
	assert.Equal(t, base, s.Stats().InUse)
	s.Recycled(nil) // nothing to do
	assert.Equal(t, base, s.Stats().InUse)
}
