package process

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// foreignStream makes a stream at the simulated driver behind cudacore's back, as another library
// does, and returns it with its destroy (its owner's).
func foreignStream(t *testing.T, d *Device) (cuda.Stream, func()) {
	t.Helper()
	h, err := d.Driver().StreamCreate(d.Context(), cuda.StreamNonBlocking, 0)
	require.NoError(t, err)
	gone := false
	destroy := func() {
		if !gone {
			gone = true
			require.NoError(t, d.Driver().StreamDestroy(d.Context(), h))
		}
	}
	t.Cleanup(destroy)
	return h, destroy
}

// Where a free of a block allocated on a stream cudacore did not create goes, by who vouches for the
// stream at the free. The simulator ends the process when a destroyed handle reaches it, so each case
// that frees after the owner destroyed the stream fails loudly if the handle gets through.
func TestForeignStreamFrees(t *testing.T) {
	for _, tc := range []struct {
		name     string
		watch    bool // a watcher vouches from the allocation on
		gone     bool // the watch ends before the free
		rewatch  bool // ... and the handle is watched again (a new stream with the same handle)
		destroy  bool // the owner destroys the stream before the free
		named    bool // the freeing call names the stream (FreeNamed)
		orphaned bool
	}{
		{name: "unwatched, owner keeps it", orphaned: true},
		{name: "unwatched, owner destroyed it", destroy: true, orphaned: true},
		{name: "watched", watch: true},
		{name: "watch ended, owner destroyed it", watch: true, gone: true, destroy: true, orphaned: true},
		{name: "watched again under a new generation", watch: true, gone: true, rewatch: true, orphaned: true},
		{name: "named by the freeing call", named: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := simDevice(t)
			_, err := d.FlushOrphans()
			require.NoError(t, err)
			before := d.Memory().Stats().InUse
			h, destroy := foreignStream(t, d)
			if tc.watch {
				require.NotZero(t, WatchStream(h))
				t.Cleanup(func() { StreamGone(h) })
			}
			p, err := d.AllocateSteady(4096, h)
			require.NoError(t, err)
			if tc.gone {
				assert.True(t, StreamGone(h))
			}
			if tc.rewatch {
				require.NotZero(t, WatchStream(h))
			}
			if tc.destroy {
				destroy()
			}
			if tc.named {
				require.NoError(t, d.FreeNamed(p, 4096, h))
			} else {
				require.NoError(t, d.FreeSteady(p, 4096, h))
			}
			if tc.orphaned {
				assert.Equal(t, uint64(4096), d.Orphaned())
				assert.Equal(t, before+4096, d.Memory().Stats().InUse, "an orphan stays in use until a device synchronize")
				given, err := d.FlushOrphans()
				require.NoError(t, err)
				assert.Equal(t, uint64(4096), given)
			}
			assert.Zero(t, d.Orphaned())
			assert.Equal(t, before, d.Memory().Stats().InUse)
		})
	}
}

// Default streams and cudacore's live streams need no watcher. A destroyed stream's handle that is
// watched names someone else's stream now (the driver hands handles out again): it stops counting as
// destroyed, so an allocation on it is no longer refused.
func TestOwnAndDefaultStreamsAreNotWatched(t *testing.T) {
	d := simDevice(t)
	s, err := d.Streams().Create(true, 0)
	require.NoError(t, err)
	for _, h := range []cuda.Stream{0, cuda.StreamLegacy, cuda.StreamPerThread, s.Handle()} {
		assert.Zero(t, WatchStream(h), "%#x", uint64(h))
	}
	require.NoError(t, s.Destroy())
	require.True(t, d.Streams().Destroyed(s.Handle()))
	assert.NotZero(t, WatchStream(s.Handle()), "a watcher vouches for the handle now")
	assert.False(t, d.Streams().Destroyed(s.Handle()))
	assert.True(t, StreamGone(s.Handle()))
}

// An allocation that runs out of memory while orphans wait succeeds once they are given back (the
// allocation door does so, without the GIL, and tries once more).
func TestOrphansGoBackBeforeOutOfMemory(t *testing.T) {
	d := simDevice(t)
	_, err := d.FlushOrphans()
	require.NoError(t, err)
	require.NoError(t, d.Memory().Release())
	// No flush of its own accord: the orphan below is far over the batch bound, and a flush on a goroutine
	// would give it back before the allocation that should meet it.
	bytes, count := orphanFlushBytes, orphanFlushCount
	orphanFlushBytes, orphanFlushCount = 1<<63, 1<<30
	t.Cleanup(func() {
		orphanFlushBytes, orphanFlushCount = bytes, count
		_, _ = d.FlushOrphans()
		_ = d.Memory().Release()
	})
	free, _, err := d.Driver().MemGetInfo(d.Context())
	require.NoError(t, err)
	h, destroy := foreignStream(t, d)
	big := free / 4 * 3
	p, err := d.AllocateSteady(big, h)
	require.NoError(t, err)
	destroy()
	require.NoError(t, d.FreeSteady(p, big, h))
	require.Equal(t, big, d.Orphaned())
	_, err = d.AllocateSteady(big, cuda.StreamLegacy)
	require.ErrorIs(t, err, cuda.ErrOutOfMemory, "the orphan still holds the memory")
	given, err := d.FlushOrphans()
	require.NoError(t, err)
	assert.Equal(t, big, given)
	q, err := d.AllocateSteady(big, cuda.StreamLegacy)
	require.NoError(t, err)
	assert.Zero(t, d.Orphaned())
	require.NoError(t, d.FreeSteady(q, big, cuda.StreamLegacy))
	require.NoError(t, d.Memory().Release())
}
