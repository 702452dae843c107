package process

import (
	"math/rand"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/memory"
)

// poolAccess reads what user may do with each pool of owner (its allocator's and its exportable pool).
func poolAccess(t *testing.T, owner, user *Device) []cuda.AccessFlags {
	t.Helper()
	multiMu.Lock()
	pools := owner.poolsLocked()
	multiMu.Unlock()
	var out []cuda.AccessFlags
	for _, pool := range pools {
		f, err := owner.Driver().MemPoolGetAccess(owner.Context(), pool, user.Handle())
		require.NoError(t, err)
		out = append(out, f)
	}
	return out
}

// Many goroutines allocate as other libraries do (LibraryAllocates, then an allocation) on three devices
// at once, while others begin and end cudacore's captures in every mode, capture on a stream of the
// "library's" own that cudacore does not know, create and destroy streams, enable peer access, switch
// device 1's strategy (a new allocator pool) and make shareable memory (the exportable pools). Nothing may
// deadlock (the test would hang) or race (go test -race), and once the others have stopped and each
// device has been reported, the two peers reach each other's every pool and the third device reaches
// none of theirs, nor they its.
func TestLibraryAllocatesUnderManyThreads(t *testing.T) {
	d0, d1, d2 := threeSimDevices(t)
	devs := []*Device{d0, d1, d2}
	drv := d0.Driver()
	const rounds, perAllocator = 8, 60
	for round := range rounds {
		forgetPeerAccess(t, devs...)
		var wg sync.WaitGroup
		stop := make(chan struct{})
		stopped := func() bool {
			select {
			case <-stop:
				return true
			default:
				return false
			}
		}
		background := func(body func(r *rand.Rand)) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewSource(int64(round)))
				for !stopped() {
					body(r)
				}
			}()
		}
		// cudacore's captures, each begun and ended on one locked thread, on every device.
		for _, d := range devs {
			background(func(r *rand.Rand) {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				s, err := d.Streams().Create(true, 0)
				if !assert.NoError(t, err) {
					return
				}
				defer func() { assert.NoError(t, s.Destroy()) }()
				mode := []cuda.CaptureMode{cuda.CaptureModeGlobal, cuda.CaptureModeThreadLocal, cuda.CaptureModeRelaxed}[r.Intn(3)]
				if !assert.NoError(t, s.BeginCapture(mode)) {
					return
				}
				runtime.Gosched()
				g, err := s.EndCapture()
				if assert.NoError(t, err, "nothing unsafe reached the driver during the capture") {
					assert.NoError(t, g.Destroy())
				}
			})
		}
		// A capture of the library's own on its own stream (a raw driver stream cudacore does not know), on
		// device 0: device 1's strategy switches synchronize its context, which no capture of that device survives.
		var libStream cuda.Stream
		libStream, err := drv.StreamCreate(d0.Context(), cuda.StreamNonBlocking, 0)
		require.NoError(t, err)
		background(func(*rand.Rand) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if !assert.NoError(t, drv.StreamBeginCapture(d0.Context(), libStream, cuda.CaptureModeThreadLocal)) {
				return
			}
			d0.LibraryAllocates(libStream) // refused while it captures, unless d1 is done already
			g, err := drv.StreamEndCapture(d0.Context(), libStream)
			if assert.NoError(t, err, "the library's capture survives") {
				assert.NoError(t, drv.GraphDestroy(d0.Context(), g))
			}
		})
		background(func(r *rand.Rand) { // streams come and go
			d := devs[r.Intn(3)]
			s, err := d.Streams().Create(r.Intn(2) == 0, 0)
			if assert.NoError(t, err) {
				assert.NoError(t, s.Destroy())
			}
		})
		background(func(r *rand.Rand) { // the user enables peer access too
			a, b := devs[r.Intn(2)], devs[1-r.Intn(2)]
			if a != b {
				assert.NoError(t, a.EnablePeerAccess(b))
			}
			assert.ErrorIs(t, d2.EnablePeerAccess(devs[r.Intn(2)]), cuda.ErrNotSupported)
		})
		background(func(r *rand.Rand) { // device 1's allocator gets new pools
			// Refused while an allocation is out or a capture runs: that is the rule, not a failure.
			_ = d1.SetStrategy([]string{"pool", "sync"}[r.Intn(2)], memory.StackOptions{OwnPool: true})
		})
		background(func(r *rand.Rand) { // the exportable pools are made and used
			d := devs[r.Intn(3)]
			if p, err := d.ShareAllocate(4096, 0, KindPool); err == nil {
				assert.NoError(t, d.ShareFree(p, KindPool, 0))
			} else {
				assert.ErrorIs(t, err, cuda.ErrCapture, "refused only for a capture")
			}
		})

		var allocators sync.WaitGroup
		for w := range 4 {
			allocators.Add(1)
			go func() {
				defer allocators.Done()
				r := rand.New(rand.NewSource(int64(round*10 + w)))
				for range perAllocator {
					d := devs[r.Intn(3)]
					d.LibraryAllocates(0)
					if p, err := d.AllocateSteady(4096, cuda.StreamLegacy); err == nil {
						assert.NoError(t, d.FreeSteady(p, 4096, cuda.StreamLegacy))
					}
				}
			}()
		}
		allocators.Wait()
		close(stop)
		wg.Wait()
		require.NoError(t, drv.StreamDestroy(d0.Context(), libStream))

		require.Zero(t, ActiveCaptures())
		for _, d := range devs {
			require.True(t, d.LibraryAllocates(0), "device %d is opened once no capture runs", d.Ordinal())
		}
		require.NoError(t, d1.SetStrategy("pool", memory.StackOptions{OwnPool: true}))
		for _, pair := range [][2]*Device{{d0, d1}, {d1, d0}} {
			for i, f := range poolAccess(t, pair[0], pair[1]) {
				assert.Equal(t, cuda.AccessReadWrite, f, "round %d: device %d reaches pool %d of device %d",
					round, pair[1].Ordinal(), i, pair[0].Ordinal())
			}
		}
		for _, pair := range [][2]*Device{{d0, d2}, {d2, d0}, {d1, d2}, {d2, d1}} {
			for _, f := range poolAccess(t, pair[0], pair[1]) {
				assert.Equal(t, cuda.AccessNone, f, "round %d: no peers", round)
			}
		}
	}
}

// A strategy switch destroys the old allocator's pool (an own pool) once the new allocator is in place,
// while EnablePeerAccess, on another goroutine, grants a peer access to the pools it read from the device.
// The grant must never name a pool the switch has destroyed: on the real driver that is a destroyed
// handle (the simulator answers INVALID_VALUE). Switches to "sync", whose allocator has no pool to grant,
// left the old pool to be destroyed while a grant read before the switch was still under way.
func TestEnablePeerAccessWhileTheStrategySwitches(t *testing.T) {
	d0, d1, _ := threeSimDevices(t)
	defer func() { require.NoError(t, d1.SetStrategy("pool", memory.StackOptions{OwnPool: true})) }()
	const switches = 3000
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(done)
		for i := range switches {
			if !assert.NoError(t, d1.SetStrategy([]string{"pool", "sync"}[i%2], memory.StackOptions{OwnPool: true})) {
				return
			}
		}
	}()
	grants := 0
	for {
		select {
		case <-done:
			wg.Wait()
			t.Logf("%d grants during %d switches", grants, switches)
			return
		default:
		}
		require.NoError(t, d0.EnablePeerAccess(d1))
		grants++
	}
}
