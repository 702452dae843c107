package process

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/device"
)

// A free of graph memory on its own capturing stream is a free node of that capture. If the capture ends
// on another thread (its stream destroyed, say) between the decision that it is a free node and the
// driver's free, the capture's end voids the memory (taking it off the books) and the free then takes
// it off the books a second time: in_use ended one block below what it should (allocate_tiles' rollback
// against Stream.close, issue 30). The test widens the window with the allocator's inFlight lock, which
// the driver's free takes after the decision.
func TestFreeNodeAgainstCaptureEndByDestroy(t *testing.T) {
	d := simDevice(t)
	if d.Strategy() != device.StrategyPool {
		t.Skip("needs the pool strategy (graph memory)")
	}
	const size = 4096
	before := d.Memory().Stats().InUse
	s, err := d.Streams().Create(true, 0)
	require.NoError(t, err)
	require.NoError(t, s.BeginCapture(cuda.CaptureModeRelaxed))
	p, token, err := d.AllocateOwned(size, s.Handle())
	require.NoError(t, err)
	require.NotZero(t, token, "an allocation on a capturing stream is graph memory with an owner token")

	d.inFlight.Lock()
	held := true
	defer func() {
		if held {
			d.inFlight.Unlock()
		}
	}()
	freed := make(chan error, 1)
	go func() { freed <- d.FreeOwned(p, size, s.Handle(), token) }()
	time.Sleep(50 * time.Millisecond) // FreeOwned decided on a free node; its driver free waits for inFlight

	destroyed := make(chan error, 1)
	go func() { destroyed <- s.Destroy() }()
	time.Sleep(50 * time.Millisecond) // before the fix: the capture ends and voids p meanwhile
	d.inFlight.Unlock()
	held = false

	require.NoError(t, waitErr(t, "FreeOwned", freed, 2*time.Second))
	require.NoError(t, waitErr(t, "Destroy", destroyed, 2*time.Second))
	assert.Equal(t, before, d.Memory().Stats().InUse, "the block was taken off the books twice (or not at all)")
}
