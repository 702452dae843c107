package process

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
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
			runtime.LockOSThread() // a THREAD_LOCAL or GLOBAL capture must end on the thread that began it
			defer runtime.UnlockOSThread()
			d := simDevice(t)
			before := d.Memory().Stats().InUse
			s, err := d.Streams().Create(true, 0)
			require.NoError(t, err)
			defer func() { _ = s.Destroy() }()

			_, _, err = d.AllocateTiles(4, 4096, tc.h, func(done, total int) bool {
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
			d := simDevice(t)
			s, err := d.Streams().Create(true, 0)
			require.NoError(t, err)
			defer func() { _ = s.Destroy() }()
			require.NoError(t, d.Memory().Release())
			before := d.Memory().Stats().InUse

			require.NoError(t, s.BeginCapture(cuda.CaptureModeThreadLocal))
			var g *stream.Graph
			var tiles []cuda.DevicePtr
			_, _, err = d.AllocateTiles(4, 4096, s.Handle(), func(done, total int) bool {
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

// Found by the fuzzer (seed 103992, a hang): AllocateTiles held its stream's lifetime lock (a read lock)
// for the whole call, and the rollback of a failed call took it again for each free. A stream created on
// another thread in between (Manager.Create, which waits for the write lock) queued behind the first read
// lock, so the second one waited behind the writer for good, and the creating thread held the GIL: the
// process hung. The rollback must finish, and the stream be created, whatever comes in between.
func TestTilesRolledBackWhileAStreamIsCreated(t *testing.T) {
	d := simDevice(t)
	before := d.Memory().Stats().InUse
	s, err := d.Streams().Create(true, 0)
	require.NoError(t, err) // destroyed at the end: after a deadlock its Destroy would wait for good

	created := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		_, _, err := d.AllocateTiles(4, 4096, s.Handle(), func(done, total int) bool {
			go func() { // another thread creates a stream while the tiles are made
				c, err := d.Streams().Create(true, 0)
				if err == nil {
					err = c.Destroy()
				}
				created <- err
			}()
			waitUntilBlocked(t, "(*lifetimes).reborn") // the creation waits for the write lock
			return false                               // cancel: the rollback frees the tile on s
		})
		done <- err
	}()
	select {
	case err := <-done:
		require.Error(t, err, "cancelled")
	case <-time.After(10 * time.Second):
		t.Fatal("the rollback of AllocateTiles deadlocked with a stream's creation")
	}
	select {
	case err := <-created:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the stream's creation never finished")
	}
	require.NoError(t, s.Destroy())
	assert.Equal(t, before, d.Memory().Stats().InUse, "the tile was freed")
}

// The lock order (Device.inFlight): the allocator (inFlight) before the capture registry's mutex, as
// Allocate takes them while a capture runs. The rollback of AllocateTiles held the registry's mutex
// (RunOrDefer) while it waited for the allocator to free a tile: with the allocator taken for writing
// (SetStrategy) or a writer waiting, and an Allocate holding it for reading and waiting for the
// registry, the three threads hung. While the rollback waits for the allocator, the registry must be free.
func TestTileRollbackDoesNotHoldTheRegistryWhileWaitingForTheAllocator(t *testing.T) {
	d := simDevice(t)
	before := d.Memory().Stats().InUse
	p, err := d.Allocate(4096, cuda.StreamLegacy) // a tile of a failed call
	require.NoError(t, err)

	d.inFlight.Lock() // as SetStrategy holds it
	rolledBack := make(chan error, 1)
	go func() { rolledBack <- (&tileResource{d: d}).Deallocate(p, 4096, cuda.StreamLegacy) }()
	waitUntilWaiting(t, "(*Device).freeNow", "sync.(*RWMutex).RLock") // the rollback waits for the allocator
	registry := make(chan int, 1)
	go func() { registry <- captures.Deferred() }() // takes the registry's mutex, as Allocate does
	select {
	case <-registry:
		d.inFlight.Unlock()
	case <-time.After(5 * time.Second):
		t.Error("the tile rollback holds the capture registry while it waits for the allocator")
		d.inFlight.Unlock()
		<-registry
	}
	require.NoError(t, <-rolledBack)
	assert.Equal(t, before, d.Memory().Stats().InUse, "the tile was freed")
}

// waitUntilBlocked waits until a goroutine is blocked taking a write lock in a function whose name
// contains fn (or a second has passed: the caller's test then checks less, and never fails for it).
func waitUntilBlocked(t *testing.T, fn string) {
	t.Helper()
	waitUntilWaiting(t, fn, "sync.(*RWMutex).Lock")
}

// waitUntilWaiting waits until a goroutine is blocked in lock (a function name, such as
// "sync.(*RWMutex).RLock") called from a function whose name contains fn, or a second has passed.
func waitUntilWaiting(t *testing.T, fn, lock string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, fn) && strings.Contains(g, lock) {
				return
			}
		}
	}
}

// Found by the fuzzer (seeds 103919 and, likely, 104843): AllocateTiles releases the GIL, and a capture
// began on its stream on another thread while the tiles were made. The tiles allocated after that were
// allocation nodes of the capture at the driver, but AllocateTiles had looked for a capture only when it
// began, so they were booked as ordinary memory: freed after the capture's graph was gone they reached the
// driver as frees of graph memory no launch had allocated (refused; through the recycle log, a block kept
// in use for good). Each tile is allocated under the rules of the moment it is made.
func TestTilesAllocatedUnderACaptureBegunMeanwhile(t *testing.T) {
	d := simDevice(t)
	before := d.Memory().Stats().InUse
	s, err := d.Streams().Create(true, 0)
	require.NoError(t, err)
	defer func() { _ = s.Destroy() }()

	ptrs, _, err := d.AllocateTiles(4, 4096, s.Handle(), func(done, total int) bool {
		if done == 2 {
			require.NoError(t, s.BeginCapture(cuda.CaptureModeRelaxed)) // as another thread would
		}
		return true
	})
	require.NoError(t, err)
	require.Len(t, ptrs, 4)
	assert.False(t, d.Streams().GraphMemory(s.Handle(), ptrs[1]), "made before the capture began")
	assert.True(t, d.Streams().GraphMemory(s.Handle(), ptrs[2]), "made in the capture: its graph memory")
	g, err := s.EndCapture()
	require.NoError(t, err)
	require.NoError(t, g.Destroy()) // never launched: the capture's tiles are void
	for _, p := range ptrs {
		require.NoError(t, d.Free(p, 4096, s.Handle()), "%#x", uint64(p))
	}
	require.NoError(t, s.Synchronize())
	assert.Equal(t, before, d.Memory().Stats().InUse, "every tile off the books once")
}

// Graph memory of a discarded capture is void in the books until its owner frees it (a no-op) or the
// driver hands the address out again, which the real driver may do for any later allocation once the
// capture released it. Only a capture's allocations used to forget a void entry: an ordinary allocation of
// the same size at that address then had its free taken for the old owner's no-op, and its bytes stayed in
// use and allocated for good. Every allocation now forgets a void entry of its address.
func TestAnAddressOfVoidGraphMemoryHandedOutAgainIsOrdinaryMemory(t *testing.T) {
	const size = 200000
	for _, tc := range []struct {
		name string
		h    func(s *stream.Stream) cuda.Stream
	}{
		{"legacy", func(*stream.Stream) cuda.Stream { return cuda.StreamLegacy }},
		{"own stream", func(s *stream.Stream) cuda.Stream { return s.Handle() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			d, sim := reusingSimDevice(t)
			before := d.Memory().Stats().InUse
			s, err := d.Streams().Create(true, 0)
			require.NoError(t, err)
			defer func() { _ = s.Destroy() }()

			require.NoError(t, s.BeginCapture(cuda.CaptureModeThreadLocal))
			old, err := d.Allocate(size, s.Handle()) // graph memory; its owner never frees it
			require.NoError(t, err)
			require.NoError(t, s.AbortCapture()) // void: the driver never allocated it
			require.Equal(t, before, d.Memory().Stats().InUse)

			p, err := d.Allocate(size, tc.h(s))
			require.NoError(t, err)
			require.Equal(t, old, p, "the simulator handed the address out again, as the driver may")
			require.NoError(t, d.Free(p, size, tc.h(s)))
			assert.Equal(t, before, d.Memory().Stats().InUse, "the new owner's free was a real free")
			require.NoError(t, d.Memory().Release())
			assert.Error(t, sim.MemFreeAsync(d.Context(), p, cuda.StreamLegacy), "the block went back to the driver")
		})
	}
}

// The owner token of an allocation made during a capture comes back with the allocation itself. Looked
// up by address afterwards (as the Python layer did, with Python code and so other threads in between),
// it was gone once the capture was aborted meanwhile, and once the address was handed to a new capture
// allocation it was that new owner's: the old Buffer then carried the new owner's token, and its late
// close freed the new owner's memory (fuzzer hunt of seed 9044 on the simulator: in_use wrapped near
// 2**64). Tiles carry their tokens the same way, and a rolled-back tile whose memory went void frees
// nothing.
func TestAllocationsReturnTheirOwnerToken(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d, _ := reusingSimDevice(t)
	s, err := d.Streams().Create(true, 0)
	require.NoError(t, err)
	defer func() { _ = s.Destroy() }()

	require.NoError(t, s.BeginCapture(cuda.CaptureModeRelaxed))
	p, tok, err := d.AllocateOwned(4096, s.Handle())
	require.NoError(t, err)
	require.NotZero(t, tok, "graph memory has an owner")
	require.NoError(t, s.AbortCapture()) // void
	assert.Zero(t, d.Streams().Token(p), "looked up after the void, the token is gone")

	require.NoError(t, s.BeginCapture(cuda.CaptureModeRelaxed))
	q, newer, err := d.AllocateOwned(4096, s.Handle())
	require.NoError(t, err)
	require.Equal(t, p, q, "the address handed out again")
	assert.Equal(t, newer, d.Streams().Token(p), "looked up now, it is the newer owner's")
	assert.True(t, d.Streams().TokenStale(p, tok), "the first owner's own token frees nothing")
	require.NoError(t, s.AbortCapture())

	require.NoError(t, s.BeginCapture(cuda.CaptureModeRelaxed))
	ptrs, tokens, err := d.AllocateTiles(3, 4096, s.Handle(), nil)
	require.NoError(t, err)
	for i := range ptrs {
		assert.Equal(t, d.Streams().Token(ptrs[i]), tokens[i], "tile %d", i)
		assert.NotZero(t, tokens[i])
	}
	require.NoError(t, s.AbortCapture())
	inUse := d.Memory().Stats().InUse
	r := &tileResource{d: d, tokens: map[cuda.DevicePtr]uint64{ptrs[0]: tokens[0]}}
	require.NoError(t, r.Deallocate(ptrs[0], 4096, s.Handle()), "a rollback of a void tile")
	assert.Equal(t, inUse, d.Memory().Stats().InUse, "frees nothing")
	forgetVoided(d)
	assert.False(t, d.Streams().GraphMemoryInUse(), "nothing left on the books")
}

// A close of graph memory during its own capture is a free node; when the driver answers that the
// capture was already invalidated (901), cudacore ends the capture, which voids the memory, and the close
// succeeds: nothing is left to free. With owner tokens the void entry carries the owner's token, and the
// free node's path dropped it (a free by address), so the close raised the 901 instead (the H100 fuzzer:
// "closing a live buffer raised CaptureError ... 901", 4 programs in 10,000).
func TestAFreeNodeOfAnInvalidatedCaptureFreesNothing(t *testing.T) {
	for _, owned := range []bool{true, false} {
		t.Run(map[bool]string{true: "owner token", false: "by address"}[owned], func(t *testing.T) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			d := simDevice(t)
			sim := d.Driver().(*cudasim.Driver)
			before := d.Memory().Stats().InUse
			s, err := d.Streams().Create(true, 0)
			require.NoError(t, err)
			defer func() { _ = s.Destroy() }()
			require.NoError(t, s.BeginCapture(cuda.CaptureModeRelaxed))
			p, tok, err := d.AllocateOwned(4096, s.Handle())
			require.NoError(t, err)
			require.NotZero(t, tok)
			sim.InjectFault("cuMemFreeAsync", 1, cuda.ErrorStreamCaptureInvalidated)
			if !owned {
				tok = 0
			}
			assert.NoError(t, d.FreeOwned(p, 4096, s.Handle(), tok), "the capture's end voided it: nothing to free")
			sim.ClearFaults()
			assert.False(t, s.Capturing(), "cudacore ended the invalidated capture")
			assert.Equal(t, before, d.Memory().Stats().InUse)
			forgetVoided(d)
			assert.False(t, d.Streams().GraphMemoryInUse(), "nothing left on the books")
		})
	}
}

// A capture allocation freed by address inside its capture (a free node: PyTorch's frees carry no
// token) left its owner token behind, and an ordinary allocation given the address later came back with
// it (found by review): such a Buffer took the graph-memory path on every close. The free node drops the
// token, and only an allocation of a capture gets one.
func TestAnOrdinaryAllocationNeverGetsAnEarlierOwnersToken(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d, _ := reusingSimDevice(t)
	s, err := d.Streams().Create(true, 0)
	require.NoError(t, err)
	defer func() { _ = s.Destroy() }()
	require.NoError(t, s.BeginCapture(cuda.CaptureModeRelaxed))
	p, tok, err := d.AllocateOwned(4096, s.Handle())
	require.NoError(t, err)
	require.NotZero(t, tok)
	require.NoError(t, d.FreeSteady(p, 4096, s.Handle()), "by address: a free node of the capture")
	assert.Zero(t, d.Streams().Token(p), "the free node drops the token")
	g, err := s.EndCapture()
	require.NoError(t, err)
	require.NoError(t, g.Destroy())
	var got []cuda.DevicePtr
	for range 4 {
		q, tk, err := d.AllocateOwned(4096, s.Handle())
		require.NoError(t, err)
		assert.Zero(t, tk, "an ordinary allocation at %#x (the earlier owner's was %#x)", q, p)
		got = append(got, q)
	}
	for _, q := range got {
		require.NoError(t, d.Free(q, 4096, s.Handle()))
	}
	forgetVoided(d)
}

// reusingSimDevice is simDevice with the simulator handing released addresses out again, as the driver
// may (back to none when the test ends).
func reusingSimDevice(t *testing.T) (*Device, *cudasim.Driver) {
	t.Helper()
	d := simDevice(t)
	sim, ok := d.Driver().(*cudasim.Driver)
	require.True(t, ok)
	require.NoError(t, sim.SetMemoryConditions(0, cudasim.MemoryConditions{ReuseAddresses: true}))
	t.Cleanup(func() { assert.NoError(t, sim.SetMemoryConditions(0, cudasim.MemoryConditions{})) })
	return d, sim
}

// forgetVoided lets go of the void memory d reported, as the Python layer does for the Buffers it closes,
// so that the process-wide device is left with nothing on its books.
func forgetVoided(d *Device) {
	for _, v := range d.Streams().TakeVoided() {
		d.Streams().ForgetVoid(v.Ptr, v.Token)
	}
}
