package process

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/stream"
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

// A tile allocated on a capturing stream is graph memory (an allocation node of the capture). When the
// capture has ended by the time the rollback of the failed call frees the tile, the free must follow the
// graph's rules as Device.Free does: the graph holds the address, and it is no allocation until a
// launch, so it must not go back to the allocator's cache, which would hand it out again as memory.
func TestTilesRolledBackAfterTheirCaptureEndedAreGraphMemory(t *testing.T) {
	for _, tc := range []struct {
		name  string
		abort bool
	}{{"ended", false}, {"aborted", true}} {
		t.Run(tc.name, func(t *testing.T) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			t.Setenv("CUDACORE_BACKEND", "sim")
			d, err := GetDevice(0)
			require.NoError(t, err)
			Replay()
			s, err := d.Streams().Create(true, 0)
			require.NoError(t, err)
			defer func() { _ = s.Destroy() }()
			require.NoError(t, d.Memory().Release())
			before := d.Memory().Stats().InUse

			require.NoError(t, s.BeginCapture(cuda.CaptureModeThreadLocal))
			var g *stream.Graph
			var tiles []cuda.DevicePtr
			_, err = d.AllocateTiles(4, 4096, s.Handle(), func(done, total int) bool {
				if done < 2 {
					return true
				}
				if tc.abort {
					require.NoError(t, s.AbortCapture())
				} else {
					g, err = s.EndCapture()
					require.NoError(t, err)
				}
				return false // cancel: roll back after the capture ended
			})
			require.Error(t, err)
			assert.Equal(t, before, d.Memory().Stats().InUse, "the rolled-back tiles are off the books")
			if g != nil {
				assert.Equal(t, 2, g.Allocations(), "the graph's allocation nodes are the two tiles")
				require.NoError(t, g.Launch(s), "the graph allocates its tiles, and frees them after the launch (nobody holds them)")
				require.NoError(t, s.Synchronize())
				require.NoError(t, g.Launch(s), "so it launches again")
				require.NoError(t, s.Synchronize())
				require.NoError(t, g.Destroy())
			}
			// Nothing the allocator caches or hands out is an address of the capture's graph memory.
			for range 4 {
				p, err := d.Allocate(4096, s.Handle())
				require.NoError(t, err)
				tiles = append(tiles, p)
				require.NoError(t, d.Streams().CopyHtoD(p, make([]byte, 4096), s), "the allocation is memory")
			}
			for _, p := range tiles {
				require.NoError(t, d.Free(p, 4096, s.Handle()))
			}
			require.NoError(t, s.Synchronize())
			require.NoError(t, d.Memory().Release(), "every cached block is an allocation the driver can free")
			assert.Equal(t, before, d.Memory().Stats().InUse)
		})
	}
}
