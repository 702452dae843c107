package memory

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// streamCheck is a Resource that records the streams "destroyed" (after ReleaseStream, as
// stream.Stream.destroy does before cuStreamDestroy) and counts frees ordered on one of them: on the
// real driver a stale stream handle crashes the process (pkg/stream/lifetime.go).
type streamCheck struct {
	*fakeRes
	mu    sync.Mutex
	dead  map[cuda.Stream]bool
	stale atomic.Int32
}

func (r *streamCheck) Deallocate(p cuda.DevicePtr, size uint64, s cuda.Stream) error {
	r.mu.Lock()
	if r.dead[s] {
		r.stale.Add(1)
	}
	r.mu.Unlock()
	return r.fakeRes.Deallocate(p, size, s)
}

// The cache's contract: "a stream must be emptied with ReleaseStream before it is destroyed". A Release
// running at the same time (release_cached_memory and the out-of-memory retry run without the GIL, and take
// no stream's lifetime lock) detaches a stream's blocks and frees them after it has let go of the cache's
// locks; a ReleaseStream in between finds nothing, the stream is destroyed, and Release then frees the
// block on the destroyed stream's handle.
func TestReleaseRacingReleaseStreamFreesOnADestroyedStream(t *testing.T) {
	r := &streamCheck{fakeRes: newFake(), dead: map[cuda.Stream]bool{}}
	r.oomEvery, r.badEvery = 0, 0
	c := NewCache(r, CacheOptions{})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				_ = c.Release()
			}
		}
	}()
	deadline := time.Now().Add(3 * time.Second)
	for i := 0; time.Now().Before(deadline) && r.stale.Load() == 0; i++ {
		s := cuda.Stream(0x1000 + uint64(i))
		p, err := c.Allocate(4096, s)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Deallocate(p, 4096, s); err != nil { // cached on s
			t.Fatal(err)
		}
		if err := c.ReleaseStream(s); err != nil {
			t.Fatal(err)
		}
		r.mu.Lock()
		r.dead[s] = true // cuStreamDestroy
		r.mu.Unlock()
	}
	close(stop)
	wg.Wait()
	if n := r.stale.Load(); n != 0 {
		t.Fatalf("%d cached block(s) freed on a stream after ReleaseStream (destroyed at the driver)", n)
	}
}
