package process

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/memory"
)

// threeSimDevices returns the three simulated devices the package's tests run on (TestMain): 0 and 1
// peers, 2 in a peer group of its own.
func threeSimDevices(t *testing.T) (d0, d1, d2 *Device) {
	t.Helper()
	devs := make([]*Device, 3)
	for i := range devs {
		var err error
		devs[i], err = GetDevice(i)
		require.NoError(t, err)
	}
	return devs[0], devs[1], devs[2]
}

func TestPeersAndSharingOnTheSimulator(t *testing.T) {
	d0, d1, d2 := threeSimDevices(t)
	forgetPeerAccess(t, d0, d1, d2)
	drv := d0.Driver()

	can, err := d0.CanAccessPeer(d1)
	require.NoError(t, err)
	assert.True(t, can)
	can, err = d0.CanAccessPeer(d2)
	require.NoError(t, err)
	assert.False(t, can)

	pool1 := d1.Memory().Pool().Handle()
	before, err := drv.MemPoolGetAccess(d1.Context(), pool1, d0.Handle())
	require.NoError(t, err)
	assert.Equal(t, cuda.AccessNone, before)
	require.NoError(t, d0.EnablePeerAccess(d1))
	require.NoError(t, d0.EnablePeerAccess(d1), "idempotent")
	after, err := drv.MemPoolGetAccess(d1.Context(), pool1, d0.Handle())
	require.NoError(t, err)
	assert.Equal(t, cuda.AccessReadWrite, after, "peer access covers the peer's allocator pool")
	assert.Equal(t, []int{0}, d1.PeersWithAccess())
	assert.ErrorIs(t, d0.EnablePeerAccess(d2), cuda.ErrNotSupported)
	assert.ErrorIs(t, d0.EnablePeerAccess(d0), cuda.ErrInvalidValue)

	// d1's exportable pool, made after peer access was enabled, is opened to d0 as it is made.
	p, err := d1.ShareAllocate(4096, 0, "")
	require.NoError(t, err)
	multiMu.Lock()
	share1 := sharePools[1]
	multiMu.Unlock()
	acc, err := drv.MemPoolGetAccess(d1.Context(), share1, d0.Handle())
	require.NoError(t, err)
	assert.Equal(t, cuda.AccessReadWrite, acc)

	// Export and import (the simulator lets a process import its own pool; the bytes are shared).
	require.NoError(t, drv.MemcpyHtoD(d1.Context(), p, []byte("shared bytes")))
	e, err := d1.ShareExport(p, KindPool)
	require.NoError(t, err)
	defer closeFD(e.FD)
	assert.Equal(t, KindPool, e.Kind)
	q, err := d1.ShareImport(KindPool, e.Handle, e.FD, e.PoolID)
	require.NoError(t, err)
	assert.NotEqual(t, p, q)
	got := make([]byte, 12)
	require.NoError(t, drv.MemcpyDtoH(d1.Context(), got, q))
	assert.Equal(t, "shared bytes", string(got))
	again, err := d1.ShareImport(KindPool, e.Handle, -1, e.PoolID)
	require.NoError(t, err, "the pool is imported once; later imports need no descriptor")
	require.NoError(t, d1.ShareClose(again, KindPool))
	require.NoError(t, d1.ShareClose(q, KindPool))
	_, err = d1.ShareImport(KindPool, e.Handle, -1, "another pool")
	assert.ErrorIs(t, err, cuda.ErrInvalidValue, "an unknown pool needs its descriptor")
	_, err = d1.ShareImport("bogus", e.Handle, -1, "")
	assert.ErrorIs(t, err, cuda.ErrInvalidValue)
	require.NoError(t, d1.ShareFree(p, KindPool, 0))

	// A strategy switch makes a new allocator pool: the peers keep their access to it.
	require.NoError(t, d1.SetStrategy("sync", memory.StackOptions{}))
	require.NoError(t, d1.SetStrategy("pool", memory.StackOptions{OwnPool: true}))
	newPool := d1.Memory().Pool().Handle()
	require.NotEqual(t, pool1, newPool)
	acc, err = drv.MemPoolGetAccess(d1.Context(), newPool, d0.Handle())
	require.NoError(t, err)
	assert.Equal(t, cuda.AccessReadWrite, acc, "the new pool is opened to the peer too")

	probe := ProbeIPC(d2)
	assert.Equal(t, map[string]string{"posix_fd": "ok", "cuipc_mem": "ok", "cuipc_event": "ok"}, probe)
}

// forgetPeerAccess puts the devices back to where no library has allocated on them (LibraryAllocates) and
// none was given access to another's pools, so that a test sees each grant made again whatever the tests
// before it did (the driver's context peer access stays: enabling it again is allowed).
func forgetPeerAccess(t *testing.T, devs ...*Device) {
	t.Helper()
	libMu.Lock()
	libraryDevices = nil
	libMu.Unlock()
	multiMu.Lock()
	defer multiMu.Unlock()
	for _, owner := range devs {
		owner.library.Store(false)
		delete(peersOf, owner.Ordinal())
		for _, pool := range owner.poolsLocked() {
			for _, user := range devs {
				if can, err := user.CanAccessPeer(owner); err == nil && can {
					require.NoError(t, owner.Driver().MemPoolSetAccess(owner.Context(), pool, user.Handle(), cuda.AccessNone))
				}
			}
		}
	}
}

// TestLibraryAllocatesOpensDevicesToEachOther: the devices other libraries' allocators use get access to
// each other's memory, pools included, the first time each is used, where the two can access each other;
// a device that cannot reach the others is left alone; nothing is done while a capture runs.
func TestLibraryAllocatesOpensDevicesToEachOther(t *testing.T) {
	d0, d1, d2 := threeSimDevices(t)
	drv := d0.Driver()
	access := func(owner, user *Device) cuda.AccessFlags {
		f, err := drv.MemPoolGetAccess(owner.Context(), owner.Memory().Pool().Handle(), user.Handle())
		require.NoError(t, err)
		return f
	}
	forgetPeerAccess(t, d0, d1, d2)

	// A stream of the library's own that captures (cudacore does not know the capture): nothing yet.
	s, err := drv.StreamCreate(d0.Context(), cuda.StreamNonBlocking, 0)
	require.NoError(t, err)
	require.NoError(t, drv.StreamBeginCapture(d0.Context(), s, cuda.CaptureModeThreadLocal))
	assert.False(t, d0.LibraryAllocates(s), "not while the library's stream captures")
	g, err := drv.StreamEndCapture(d0.Context(), s)
	require.NoError(t, err)
	require.NoError(t, drv.GraphDestroy(d0.Context(), g))
	assert.True(t, d0.LibraryAllocates(s))
	require.NoError(t, drv.StreamDestroy(d0.Context(), s))
	assert.True(t, d2.LibraryAllocates(0)) // no peer of d0: nothing to open, and done
	assert.Equal(t, cuda.AccessNone, access(d2, d0))
	assert.Equal(t, cuda.AccessNone, access(d0, d2))
	assert.True(t, d1.LibraryAllocates(0))
	assert.Equal(t, cuda.AccessReadWrite, access(d0, d1), "d1 reaches d0's pool")
	assert.Equal(t, cuda.AccessReadWrite, access(d1, d0), "d0 reaches d1's pool")
	assert.Contains(t, d0.PeersWithAccess(), 1)
	assert.Contains(t, d1.PeersWithAccess(), 0)
	assert.True(t, d1.LibraryAllocates(0), "once done, done")
}

// A stream cudacore destroyed, named by a library's allocator (CuPy's current stream wrapping a closed
// cudacore Stream, say): its handle never reaches the driver (the real driver crashes there; the simulator
// ends the test process), and the device is not done, since nothing could be checked; the allocation that
// follows refuses the stream as Allocate does.
func TestLibraryAllocatesNeverNamesADestroyedStream(t *testing.T) {
	d0, d1, d2 := threeSimDevices(t)
	forgetPeerAccess(t, d0, d1, d2)
	s, err := d0.Streams().Create(true, 0)
	require.NoError(t, err)
	h := s.Handle()
	require.NoError(t, s.Destroy())
	assert.False(t, d0.LibraryAllocates(h), "nothing is done on a destroyed stream")
	_, err = d0.AllocateSteady(4096, h)
	assert.Equal(t, cuda.ErrorClosed, cuda.ResultOf(err))
	assert.True(t, d0.LibraryAllocates(0), "done on a live stream")
}
