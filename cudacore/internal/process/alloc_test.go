package process

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// Found by the H100 fuzzer (seed 5858): a capture began on another thread while AllocateTiles ran, and
// the rollback of the failed call freed its tiles during the GLOBAL capture; the driver refused the free
// (900) and a tile stayed allocated for good. The rollback's frees and release must wait for the capture
// to end, and invalidate nothing.
func TestTilesRolledBackUnderACaptureBegunMeanwhile(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    cuda.Stream
	}{{"legacy", cuda.StreamLegacy}, {"per-thread", cuda.StreamPerThread}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("CUDACORE_BACKEND", "sim")
			d, err := GetDevice(0)
			require.NoError(t, err)
			Replay()
			before := d.Memory().Stats().InUse
			s, err := d.Streams().Create(true, 0)
			require.NoError(t, err)
			defer func() { _ = s.Destroy() }()

			_, err = d.AllocateTiles(4, 4096, tc.h, func(done, total int) bool {
				require.NoError(t, s.BeginCapture(cuda.CaptureModeGlobal)) // as another thread would
				return false                                               // cancel: roll back under the capture
			})
			require.Error(t, err)
			assert.Equal(t, before+4096, d.Memory().Stats().InUse, "the rolled-back tile waits for the capture")
			g, err := s.EndCapture()
			require.NoError(t, err, "nothing unsafe reached the driver during the capture")
			require.NoError(t, g.Destroy())
			assert.Equal(t, before, d.Memory().Stats().InUse, "freed once the capture ended")
		})
	}
}
