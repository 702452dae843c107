package stream

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
	"github.com/cudacore/cudacore/pkg/device"
)

// newStagingEnv is newEnv with a staging pool of count buffers of size bytes each.
func newStagingEnv(t *testing.T, size, count int) *env {
	t.Helper()
	return newTunedEnv(t, StagingTuning{Chunk: size, Buffers: count})
}

// newTunedEnv is newEnv with the staging tuning st.
func newTunedEnv(t *testing.T, st StagingTuning) *env {
	t.Helper()
	e := newEnv(t)
	e.m.staging = newStaging(e.m, st)
	return e
}

// withProcs runs the test with GOMAXPROCS at least n, so that copy crews of up to n workers run on a
// host of fewer cores too.
func withProcs(t *testing.T, n int) {
	t.Helper()
	if old := runtime.GOMAXPROCS(0); old < n {
		runtime.GOMAXPROCS(n)
		t.Cleanup(func() { runtime.GOMAXPROCS(old) })
	}
}

// poolState reaps what has completed and returns the pool's buffers: allocated, free, busy.
func poolState(m *Manager) (all, free, busy int) {
	p := m.staging
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reapLocked()
	return len(p.all), len(p.free), len(p.busy)
}

// TestPageableCopyChunks copies pageable memory both ways at sizes around the chunk (staging buffer) and
// piece boundaries: chunks of one piece copied by the caller (one worker) or by a crew, chunks of
// several pieces shared by a crew, more chunks than the pool holds included. The source is overwritten
// as soon as the host-to-device call returns (the caller may reuse it at once), and the device-to-host
// copy follows on the same stream without a synchronize in between (stream order).
func TestPageableCopyChunks(t *testing.T) {
	withProcs(t, 8)
	type tc struct {
		tuning StagingTuning
		sizes  []int
	}
	const small, big, piece = 4096, 64 << 10, 4096
	cases := []tc{
		{StagingTuning{Chunk: small, Buffers: 2, Workers: 1}, []int{0, 1, small - 1, small, small + 1, 2 * small, 5*small + 17}},
		{StagingTuning{Chunk: small, Buffers: 2, Workers: 4}, []int{small + 1, 2 * small, 5*small + 17}},
		{StagingTuning{Chunk: big, Buffers: 3, Workers: 8, Piece: piece}, []int{piece - 1, piece, piece + 1, big - 1, big, big + 1, 4*big + 12345}},
		{StagingTuning{Chunk: big, Buffers: 1, Workers: 3, Piece: 3 * piece}, []int{big + 1, 3*big + 5}},
		{StagingTuning{Chunk: big, Buffers: 3, Workers: 1, Piece: piece}, []int{big + 1, 4*big + 12345}},
	}
	for _, c := range cases {
		for _, n := range c.sizes {
			t.Run(fmt.Sprintf("%+v/n=%d", c.tuning, n), func(t *testing.T) {
				e := newTunedEnv(t, c.tuning)
				s := e.stream(t, true)
				p := e.alloc(t, max(n, 1))
				src := pattern(n, byte(n))
				want := bytes.Clone(src)
				require.NoError(t, e.m.CopyHtoD(p, src, s))
				for i := range src {
					src[i] = ^src[i] // the call has read it all: this must not reach the device
				}
				got := make([]byte, n)
				require.NoError(t, e.m.CopyDtoH(got, p, s))
				assert.True(t, bytes.Equal(want, got), "bytes differ")
				require.NoError(t, s.Synchronize())
				all, free, busy := poolState(e.m)
				assert.LessOrEqual(t, all, c.tuning.Buffers)
				assert.Zero(t, busy)
				assert.Equal(t, all, free, "every staging buffer is back")
			})
		}
	}
}

// TestSyncPageableCopyStaged: a synchronous copy of pageable memory above PageableDirectMax goes through the
// staging buffers on the legacy stream, both ways, and is complete when it returns; smaller ones, pinned
// memory, and any made while a capture forbids the legacy stream's synchronize go to the driver's
// synchronous copy.
func TestSyncPageableCopyStaged(t *testing.T) {
	type tc struct {
		name   string
		n      int
		pinned bool
		global bool // a GLOBAL capture runs on another stream meanwhile
		staged bool
	}
	cases := []tc{
		{"at the threshold", 4096, false, false, false},
		{"above it", 4097, false, false, true},
		{"several chunks", 5*4096 + 17, false, false, true},
		{"pinned", 5 * 4096, true, false, false},
		{"during a GLOBAL capture", 5 * 4096, false, true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			runtime.LockOSThread() // a capture's thread rules
			defer runtime.UnlockOSThread()
			e := newStagingEnv(t, 4096, 2)
			e.m.opts.PageableDirectMax = 4096
			p := e.alloc(t, c.n)
			src, dst := pattern(c.n, 3), make([]byte, c.n)
			if c.pinned {
				src = e.pinned(t, c.n)
				copy(src, pattern(c.n, 3))
				dst = e.pinned(t, c.n)
			}
			want := bytes.Clone(src)
			var capturing *Stream
			if c.global {
				capturing = e.stream(t, true)
				require.NoError(t, capturing.BeginCapture(cuda.CaptureModeGlobal))
			}
			syncH, syncD := e.drv.Calls("cuMemcpyHtoD_v2"), e.drv.Calls("cuMemcpyDtoH_v2")
			require.NoError(t, e.m.CopyHtoD(p, src, nil))
			for i := range src {
				src[i] = ^src[i] // the copy is done: this must not reach the device
			}
			require.NoError(t, e.m.CopyDtoH(dst, p, nil))
			assert.Equal(t, want, dst)
			direct := 1
			if c.staged {
				direct = 0
			}
			assert.Equal(t, syncH+direct, e.drv.Calls("cuMemcpyHtoD_v2"), "host to device: the driver's synchronous copy")
			assert.Equal(t, syncD+direct, e.drv.Calls("cuMemcpyDtoH_v2"), "device to host: the driver's synchronous copy")
			all, free, busy := poolState(e.m)
			assert.Zero(t, busy)
			assert.Equal(t, all, free, "every staging buffer is back")
			if c.staged {
				assert.Positive(t, all, "staged")
			}
			if capturing != nil {
				g, err := capturing.EndCapture()
				require.NoError(t, err, "the copies left the capture going")
				require.NoError(t, g.Destroy())
			}
		})
	}
}

// TestStagingPoolStaysBounded: many threads copying pageable memory at once, synchronously and on their
// own streams, both ways, never make the pool allocate more than its bound, and never wait for each
// other for good, down to a pool of one buffer (a device-to-host copy then lands each chunk before the
// next instead of waiting for a second buffer).
func TestStagingPoolStaysBounded(t *testing.T) {
	const chunk, threads, rounds = 4096, 12, 15
	for _, count := range []int{1, 2} {
		t.Run(fmt.Sprintf("count=%d", count), func(t *testing.T) {
			e := newStagingEnv(t, chunk, count)
			e.m.opts.PageableDirectMax = -1 // every pageable copy is staged
			allocs := e.drv.Calls("cuMemHostAlloc")
			var wg sync.WaitGroup
			errs := make(chan error, threads)
			for i := range threads {
				s := e.stream(t, true)
				p := e.alloc(t, 3*chunk+5)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for r := range rounds {
						n := 1 + ((i*rounds+r)*977)%(3*chunk+5) // one to four chunks
						on := s
						if r%2 == 0 {
							on = nil // synchronous
						}
						if err := roundTrip(e.m, p, pattern(n, byte(i+r)), on); err != nil {
							errs <- fmt.Errorf("thread %d round %d: %w", i, r, err)
							return
						}
					}
				}()
			}
			waitCopiers(t, &wg, errs)
			all, free, busy := poolState(e.m)
			assert.LessOrEqual(t, all, count, "buffers allocated")
			assert.LessOrEqual(t, e.drv.Calls("cuMemHostAlloc")-allocs, count, "allocations made")
			assert.Zero(t, busy)
			assert.Equal(t, all, free)
		})
	}
}

// A staging buffer whose copy can be neither tracked (cuEventRecord fails) nor waited for
// (cuStreamSynchronize fails too) is given up, and its slot comes free: with every slot given up, the next
// copy would otherwise wait in the pool for good.
func TestAGivenUpStagingBufferFreesItsSlot(t *testing.T) {
	e := newStagingEnv(t, 4096, 2)
	e.m.opts.PageableDirectMax = -1
	s := e.stream(t, true)
	p := e.alloc(t, 4096)
	for range 2 {
		e.drv.InjectFault("cuEventRecord", 1, cuda.ErrorUnknown)
		e.drv.InjectFault("cuStreamSynchronize", 1, cuda.ErrorUnknown)
		require.Error(t, e.m.CopyHtoD(p, pattern(4096, 1), s))
	}
	e.drv.ClearFaults()
	done := make(chan error, 1)
	go func() { done <- e.m.CopyHtoD(p, pattern(4096, 2), s) }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the copy waited in the staging pool for good")
	}
	all, _, _ := poolState(e.m)
	assert.LessOrEqual(t, all, 2)
	got := make([]byte, 4096)
	require.NoError(t, e.m.CopyDtoH(got, p, s))
	assert.Equal(t, pattern(4096, 2), got)
}

// Manager.Close while a copy is allocating a staging buffer leaves the slot the copy reserved: the new
// buffer fills it, and the pool counts it.
func TestCloseWhileAStagingBufferIsAllocated(t *testing.T) {
	drv := &hostAllocHook{Driver: cudasim.New()}
	d, err := device.Open(drv, 0, "")
	require.NoError(t, err)
	m := New(d, Options{Staging: StagingTuning{Chunk: 4096, Buffers: 2}, PageableDirectMax: -1})
	defer func() { assert.NoError(t, m.Close()) }()
	s, err := m.Create(true, 0)
	require.NoError(t, err)
	defer s.Destroy()
	p, err := drv.MemAlloc(d.Context(), 4096)
	require.NoError(t, err)
	hook := func() { assert.NoError(t, m.Close()) }
	drv.hook.Store(&hook)
	require.NoError(t, m.CopyHtoD(p, pattern(4096, 3), s))
	require.Nil(t, drv.hook.Load(), "Close ran during the allocation")
	allocated, _ := m.StagingStats()
	assert.Equal(t, 1, allocated, "the buffer is the new pool's")
	got := make([]byte, 4096)
	require.NoError(t, m.CopyDtoH(got, p, s))
	assert.Equal(t, pattern(4096, 3), got)
}

// orderLog is the simulator recording, in order, the driver calls that order a staged copy.
type orderLog struct {
	*cudasim.Driver
	mu    sync.Mutex
	calls []string
}

func (d *orderLog) note(format string, args ...any) {
	d.mu.Lock()
	d.calls = append(d.calls, fmt.Sprintf(format, args...))
	d.mu.Unlock()
}

func (d *orderLog) EventRecord(c cuda.Context, e cuda.Event, s cuda.Stream) error {
	d.note("record %#x", uint64(s))
	return d.Driver.EventRecord(c, e, s)
}

func (d *orderLog) EventSynchronize(c cuda.Context, e cuda.Event) error {
	d.note("event sync")
	return d.Driver.EventSynchronize(c, e)
}

func (d *orderLog) StreamSynchronize(c cuda.Context, s cuda.Stream) error {
	d.note("stream sync %#x", uint64(s))
	return d.Driver.StreamSynchronize(c, s)
}

func (d *orderLog) MemcpyHtoDAsync(c cuda.Context, dst cuda.DevicePtr, src []byte, s cuda.Stream) error {
	d.note("dma %#x", uint64(s))
	return d.Driver.MemcpyHtoDAsync(c, dst, src, s)
}

// A staged synchronous host-to-device copy is ordered as the driver's: it waits for the work queued
// before it on the legacy stream (an event recorded there, which also follows every blocking stream)
// before it reads the source, which the GPU may be writing until then, makes its DMAs on the legacy
// stream, and returns once that stream has done them. The simulator runs work at once, so the order of
// the driver calls is what can be checked here; TestGPUSyncCopyOrder checks the effect on a GPU.
func TestSyncStagedCopyWaitsBeforeReading(t *testing.T) {
	drv := &orderLog{Driver: cudasim.New()}
	d, err := device.Open(drv, 0, "")
	require.NoError(t, err)
	m := New(d, Options{Staging: StagingTuning{Chunk: 4096, Buffers: 2}, PageableDirectMax: 4096})
	defer func() { assert.NoError(t, m.Close()) }()
	p, err := drv.MemAlloc(d.Context(), 3*4096)
	require.NoError(t, err)
	drv.calls = nil
	require.NoError(t, m.CopyHtoD(p, pattern(3*4096, 5), nil))
	legacy := fmt.Sprintf("%#x", uint64(cuda.StreamLegacy))
	want := []string{
		"record " + legacy, "event sync", // the work before the copy is done: now the source is read
		"dma " + legacy, "record " + legacy, "dma " + legacy, "record " + legacy, "dma " + legacy, "record " + legacy,
		"stream sync " + legacy, // and the data has arrived
	}
	// The third chunk waits for the first's buffer (a pool of two) in between.
	got := slices.DeleteFunc(slices.Clone(drv.calls), func(c string) bool { return c == "event sync" })
	assert.Equal(t, slices.DeleteFunc(slices.Clone(want), func(c string) bool { return c == "event sync" }), got)
	require.GreaterOrEqual(t, len(drv.calls), 2)
	assert.Equal(t, want[:2], drv.calls[:2], "the wait comes before the first DMA")
}

// hostAllocHook is the simulator with a hook run (once) at the next cuMemHostAlloc.
type hostAllocHook struct {
	*cudasim.Driver
	hook atomic.Pointer[func()]
}

func (d *hostAllocHook) MemHostAlloc(c cuda.Context, n uint64, flags uint32) ([]byte, error) {
	run(&d.hook)
	return d.Driver.MemHostAlloc(c, n, flags)
}

// namedCopy is one copy of a table-driven test.
type namedCopy struct {
	name string
	copy func() error
}

// stagedCopies opens device 0 of drv with a Manager whose pageable copies all go through one staging
// buffer of 4 KiB (isPinned, if not nil, is its Options.IsPinned), and returns it, a stream s, another
// stream, and an asynchronous pageable copy each way on s of three staging buffers' worth.
func stagedCopies(t *testing.T, drv cuda.Driver, isPinned func(uintptr, int) bool) (*Manager, *Stream, *Stream, []namedCopy) {
	t.Helper()
	d, err := device.Open(drv, 0, "")
	require.NoError(t, err)
	m := New(d, Options{Staging: StagingTuning{Chunk: 4096, Buffers: 1}, PageableDirectMax: -1, IsPinned: isPinned})
	t.Cleanup(func() { assert.NoError(t, m.Close()) })
	s, err := m.Create(true, 0)
	require.NoError(t, err)
	other, err := m.Create(true, 0)
	require.NoError(t, err)
	p, err := drv.MemAlloc(d.Context(), 3*4096)
	require.NoError(t, err)
	return m, s, other, []namedCopy{
		{"host to device", func() error { return m.CopyHtoD(p, pattern(3*4096, 1), s) }},
		{"device to host", func() error { return m.CopyDtoH(make([]byte, 3*4096), p, s) }},
	}
}

// An asynchronous copy of pageable memory checks the capture rules and then allocates and waits for
// staging buffers, unsafe calls that would invalidate a GLOBAL capture another thread began in between.
// The check and the copy are one steady state: such a capture begins once the copy is done, and stays
// valid.
func TestAPageableCopyDoesNotInvalidateACaptureBegunMeanwhile(t *testing.T) {
	drv := &hostAllocHook{Driver: cudasim.New()}
	m, s, other, copies := stagedCopies(t, drv, nil)
	for _, c := range copies {
		t.Run(c.name, func(t *testing.T) {
			require.NoError(t, m.ReleaseStaging()) // the copy allocates its buffer again: the hook runs
			rival := newRivalCapture(other)
			hook := rival.begin // the copy is past its check: another thread begins a capture
			drv.hook.Store(&hook)
			require.NoError(t, c.copy())
			require.Nil(t, drv.hook.Load(), "the copy allocated a staging buffer")
			require.NoError(t, rival.end(), "the capture survived the copy")
			require.NoError(t, s.Synchronize())
		})
	}
}

// TestPageableCopyOrder: successive pageable copies into one device range, then a copy out, all on one
// stream without synchronizing: the last write wins and the read sees it.
func TestPageableCopyOrder(t *testing.T) {
	e := newStagingEnv(t, 4096, 3)
	s := e.stream(t, false)
	const n = 5*4096 + 100
	p := e.alloc(t, n)
	for round := range 10 {
		var last []byte
		for k := range 4 {
			last = pattern(n, byte(16*round+k))
			require.NoError(t, e.m.CopyHtoD(p, last, s))
		}
		got := make([]byte, n)
		require.NoError(t, e.m.CopyDtoH(got, p, s))
		require.True(t, bytes.Equal(last, got), "round %d", round)
	}
}

// TestStagingReused: many pageable copies, each spanning more chunks than the pool holds, allocate the
// pool once and then only reuse it; its events are reused too.
func TestStagingReused(t *testing.T) {
	const chunk, count = 4096, 3
	e := newStagingEnv(t, chunk, count)
	s := e.stream(t, true)
	const n = 7*chunk + 1
	p := e.alloc(t, n)
	src, out := pattern(n, 9), make([]byte, n)
	require.NoError(t, e.m.CopyHtoD(p, src, s))
	require.NoError(t, e.m.CopyDtoH(out, p, s))
	allocs, events := e.drv.Calls("cuMemHostAlloc"), e.drv.Calls("cuEventCreate")
	for i := range 300 {
		src[0] = byte(i)
		require.NoError(t, e.m.CopyHtoD(p, src, s))
		require.NoError(t, e.m.CopyDtoH(out, p, s))
		require.Equal(t, src, out)
	}
	assert.Equal(t, allocs, e.drv.Calls("cuMemHostAlloc"), "no pinned allocation on the steady state")
	assert.LessOrEqual(t, e.drv.Calls("cuEventCreate")-events, count, "events are reused")
	require.NoError(t, s.Synchronize())
	all, free, busy := poolState(e.m)
	assert.LessOrEqual(t, all, count)
	assert.Equal(t, all, free)
	assert.Zero(t, busy)
}

// TestPageableCopyFault injects a driver failure in the middle of a multi-chunk pageable copy, with the
// caller copying each chunk and with a crew of workers filling or emptying later chunks meanwhile: the
// call returns the typed error (a staging buffer that cannot be allocated for lack of memory fails
// nothing: the copy goes on with the buffers the pool has, or through the driver, and every byte
// arrives), every staging buffer comes back (none busy forever), the stream and pool work afterwards, and
// Close frees every pinned buffer and event the pool made.
func TestPageableCopyFault(t *testing.T) {
	withProcs(t, 4)
	one := StagingTuning{Chunk: 4096, Buffers: 2, Workers: 1}
	crew := StagingTuning{Chunk: 16 << 10, Buffers: 3, Workers: 4, Piece: 4096}
	cases := []struct {
		name   string
		dtoh   bool
		entry  string
		nth    int
		code   cuda.Result
		tuning StagingTuning
	}{
		{"HtoD DMA", false, "cuMemcpyHtoDAsync_v2", 3, cuda.ErrorInvalidValue, one},
		{"HtoD record", false, "cuEventRecord", 2, cuda.ErrorInvalidValue, one},
		{"HtoD first record", false, "cuEventRecord", 1, cuda.ErrorInvalidValue, one},
		{"HtoD event create", false, "cuEventCreate", 1, cuda.ErrorOutOfMemory, one},
		{"HtoD pinned alloc", false, "cuMemHostAlloc", 1, cuda.ErrorOutOfMemory, one},
		{"HtoD crew: second chunk's DMA", false, "cuMemcpyHtoDAsync_v2", 2, cuda.ErrorInvalidValue, crew},
		{"HtoD crew: third record", false, "cuEventRecord", 3, cuda.ErrorInvalidValue, crew},
		{"HtoD crew: second pinned alloc", false, "cuMemHostAlloc", 2, cuda.ErrorOutOfMemory, crew},
		{"DtoH DMA", true, "cuMemcpyDtoHAsync_v2", 3, cuda.ErrorInvalidValue, one},
		{"DtoH record", true, "cuEventRecord", 2, cuda.ErrorInvalidValue, one},
		{"DtoH wait", true, "cuEventSynchronize", 2, cuda.ErrorInvalidValue, one},
		{"DtoH pinned alloc", true, "cuMemHostAlloc", 2, cuda.ErrorOutOfMemory, one},
		{"DtoH event create", true, "cuEventCreate", 2, cuda.ErrorOutOfMemory, one},
		{"DtoH crew: fourth DMA", true, "cuMemcpyDtoHAsync_v2", 4, cuda.ErrorInvalidValue, crew},
		{"DtoH crew: second wait", true, "cuEventSynchronize", 2, cuda.ErrorInvalidValue, crew},
		{"DtoH crew: third record", true, "cuEventRecord", 3, cuda.ErrorInvalidValue, crew},
		{"DtoH crew: third pinned alloc", true, "cuMemHostAlloc", 3, cuda.ErrorOutOfMemory, crew},
		{"HtoD pinned alloc refused", false, "cuMemHostAlloc", 1, cuda.ErrorInvalidValue, one},
		{"DtoH crew: second pinned alloc refused", true, "cuMemHostAlloc", 2, cuda.ErrorInvalidValue, crew},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newTunedEnv(t, c.tuning)
			count := c.tuning.Buffers
			n := 5*c.tuning.Chunk + 3
			s := e.stream(t, true)
			p := e.alloc(t, n)
			buf := pattern(n, 1)
			allocs, frees := e.drv.Calls("cuMemHostAlloc"), e.drv.Calls("cuMemFreeHost")
			creates, destroys := e.drv.Calls("cuEventCreate"), e.drv.Calls("cuEventDestroy_v2")
			e.drv.InjectFault(c.entry, c.nth, c.code)
			var err error
			if c.dtoh {
				err = e.m.CopyDtoH(buf, p, s)
			} else {
				err = e.m.CopyHtoD(p, buf, s)
			}
			if c.entry == "cuMemHostAlloc" && c.code == cuda.ErrorOutOfMemory {
				require.NoError(t, err, "the copy goes on without the buffer")
				require.NoError(t, s.Synchronize())
				dev := make([]byte, n)
				require.NoError(t, e.drv.MemcpyDtoH(e.dev.Context(), dev, p))
				assert.Equal(t, buf, dev, "every byte arrived")
			} else {
				requireResult(t, c.code, err)
				var ce *cuda.Error
				require.ErrorAs(t, err, &ce)
			}
			assert.Zero(t, e.drv.ClearFaults(), "the fault was reached")

			require.NoError(t, s.Synchronize())
			all, free, busy := poolState(e.m)
			assert.Zero(t, busy, "no staging buffer stays busy")
			assert.Equal(t, all, free, "every staging buffer is back")
			assert.LessOrEqual(t, all, count)

			want := pattern(n, 2)
			got := make([]byte, n)
			require.NoError(t, e.m.CopyHtoD(p, want, s), "the pool works again")
			require.NoError(t, e.m.CopyDtoH(got, p, s))
			assert.Equal(t, want, got)

			require.NoError(t, e.m.Close())
			failed := func(entry string) int { // a failed call made nothing
				if c.entry == entry {
					return 1
				}
				return 0
			}
			assert.Equal(t, e.drv.Calls("cuMemHostAlloc")-allocs-failed("cuMemHostAlloc"), e.drv.Calls("cuMemFreeHost")-frees,
				"every pinned buffer freed")
			assert.Equal(t, e.drv.Calls("cuEventCreate")-creates-failed("cuEventCreate"), e.drv.Calls("cuEventDestroy_v2")-destroys,
				"every event destroyed")
		})
	}
}

// TestPageableCopyConcurrent runs pageable copies from several goroutines at once, on their own streams
// and on a shared one, sizes below, at and above the chunk: every copy lands intact and the pool stays
// bounded by what the copies in flight can hold.
func TestPageableCopyConcurrent(t *testing.T) {
	const chunk, count, workers = 4096, 4, 6
	e := newStagingEnv(t, chunk, count)
	shared := e.stream(t, true)
	var wg sync.WaitGroup
	for w := range workers {
		s := shared
		if w%2 == 0 {
			s = e.stream(t, true)
		}
		const n = 6*chunk + 11
		p := e.alloc(t, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				size := []int{1, chunk - 1, chunk, chunk + 1, n}[i%5]
				want := pattern(size, byte(w*40+i))
				got := make([]byte, size)
				if !assert.NoError(t, e.m.CopyHtoD(p, want, s)) || !assert.NoError(t, e.m.CopyDtoH(got, p, s)) {
					return
				}
				assert.True(t, bytes.Equal(want, got), "worker %d copy %d", w, i)
			}
		}()
	}
	wg.Wait()
	_, err := e.m.SynchronizeDevice(0, true)
	require.NoError(t, err)
	all, free, busy := poolState(e.m)
	assert.LessOrEqual(t, all, count+2*workers, "bounded: a copy holds at most two buffers at once")
	assert.Equal(t, all, free)
	assert.Zero(t, busy)
}

// BenchmarkCopyHtoDPageable runs pageable asynchronous host-to-device copies on the simulator with the
// default staging pool, synchronizing after each: a sanity check of the path's overhead, not of the
// hardware (the simulator's DMA is a memcpy).
func BenchmarkCopyHtoDPageable(b *testing.B) {
	for _, n := range []int{64 << 10, 1 << 20, 16 << 20} {
		b.Run(fmt.Sprintf("%dKiB", n>>10), func(b *testing.B) {
			e := newBenchEnv(b)
			s, err := e.m.Create(true, 0)
			require.NoError(b, err)
			defer s.Destroy()
			p, err := e.drv.MemAlloc(e.dev.Context(), uint64(n))
			require.NoError(b, err)
			defer e.drv.MemFree(e.dev.Context(), p)
			src := pattern(n, 3)
			b.SetBytes(int64(n))
			for b.Loop() {
				if err := e.m.CopyHtoD(p, src, s); err != nil {
					b.Fatal(err)
				}
				if err := s.Synchronize(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchEnv is a simulator device with a Manager of default options.
type benchEnv struct {
	drv *cudasim.Driver
	dev *device.Device
	m   *Manager
}

func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	drv := cudasim.New()
	d, err := device.Open(drv, 0, "")
	require.NoError(b, err)
	e := &benchEnv{drv: drv, dev: d, m: New(d, Options{})}
	b.Cleanup(func() {
		assert.NoError(b, e.m.Close())
		_ = d.Close()
	})
	return e
}

// TestPageableDirectMax: pageable host-to-device asynchronous copies of at most PageableDirectMax bytes go
// to the driver's own pageable copy and take no staging buffer; larger ones are staged. Either way the
// call has read the source when it returns, and the bytes arrive in stream order.
func TestPageableDirectMax(t *testing.T) {
	const direct = 3 * 4096
	cases := []struct {
		n      int
		staged bool
	}{
		{1, false}, {direct - 1, false}, {direct, false}, {direct + 1, true}, {5*direct + 7, true},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("n=%d", c.n), func(t *testing.T) {
			e := newEnv(t)
			e.m.opts.PageableDirectMax = direct
			s := e.stream(t, true)
			p := e.alloc(t, c.n)
			src := pattern(c.n, byte(c.n))
			want := bytes.Clone(src)
			require.NoError(t, e.m.CopyHtoD(p, src, s))
			allocated, _ := e.m.StagingStats()
			assert.Equal(t, c.staged, allocated > 0, "staged (%d staging buffers)", allocated)
			for i := range src {
				src[i] = ^src[i] // read already: must not reach the device
			}
			got := make([]byte, c.n)
			require.NoError(t, e.m.CopyDtoH(got, p, s))
			assert.True(t, bytes.Equal(want, got), "bytes differ")
		})
	}
	t.Run("defaults", func(t *testing.T) {
		e := newEnv(t)
		assert.Equal(t, DefaultPageableDirectMax, New(e.dev, Options{}).opts.PageableDirectMax)
		assert.Equal(t, -1, New(e.dev, Options{PageableDirectMax: -1}).opts.PageableDirectMax)
	})
}

// TestReleaseStaging: the staging buffers no copy holds are freed, and the pool allocates again for the
// next copy, whose bytes arrive as before.
func TestReleaseStaging(t *testing.T) {
	e := newEnv(t)
	const n = 3*4096 + 5 // staged in 4 KiB buffers, both of the pool's two in use
	s := e.stream(t, true)
	p := e.alloc(t, n)
	for round := range 2 {
		src := pattern(n, byte(round))
		require.NoError(t, e.m.CopyHtoD(p, src, s))
		got := make([]byte, n)
		require.NoError(t, e.m.CopyDtoH(got, p, s))
		require.NoError(t, s.Synchronize())
		assert.Equal(t, src, got, "round %d", round)
		allocated, _ := e.m.StagingStats()
		require.Equal(t, 2, allocated)
		require.NoError(t, e.m.ReleaseStaging())
		allocated, busy := e.m.StagingStats()
		assert.Zero(t, allocated, "round %d: every idle staging buffer freed", round)
		assert.Zero(t, busy)
	}
}

// copyHook is the simulator with a hook run once on entry to the first asynchronous copy of each
// direction between host and device.
type copyHook struct {
	*cudasim.Driver
	entry atomic.Pointer[func()]
}

func (d *copyHook) enter() {
	if f := d.entry.Swap(nil); f != nil {
		(*f)()
	}
}

func (d *copyHook) MemcpyHtoDAsync(c cuda.Context, dst cuda.DevicePtr, src []byte, s cuda.Stream) error {
	d.enter()
	return d.Driver.MemcpyHtoDAsync(c, dst, src, s)
}

func (d *copyHook) MemcpyDtoHAsync(c cuda.Context, dst []byte, src cuda.DevicePtr, s cuda.Stream) error {
	d.enter()
	return d.Driver.MemcpyDtoHAsync(c, dst, src, s)
}

// A staged copy makes several driver calls on its stream (a DMA and an event per staging buffer), and
// the copy doors release the GIL: a Stream.close() on another thread during the copy destroyed the
// stream between two of them, and the next call handed the driver the destroyed handle, which crashes
// the real driver (found by an adversarial review). The close now waits for the copy.
func TestStreamDestroyedDuringAStagedCopy(t *testing.T) {
	var fatal atomic.Value
	sim := cudasim.New(cudasim.WithFatal(func(msg string) { fatal.Store(msg) }))
	hook := &copyHook{Driver: sim}
	e := newEnvOn(t, sim, hook)
	const n = 5*4096 + 7 // several of newEnv's 4 KiB staging buffers
	p := e.alloc(t, n)
	for _, dir := range []string{"HtoD", "DtoH"} {
		t.Run(dir, func(t *testing.T) {
			s, err := e.m.Create(true, 0)
			require.NoError(t, err)
			destroyed := make(chan error, 1)
			hook.entry.Store(new(func() { // the first chunk's DMA: another thread closes the stream
				go func() { destroyed <- s.Destroy() }()
				select {
				case err := <-destroyed: // not held off: the stream is gone before the next chunk
					destroyed <- err
				case <-time.After(20 * time.Millisecond):
				}
			}))
			buf := pattern(n, 9)
			if dir == "HtoD" {
				err = e.m.CopyHtoD(p, buf, s)
			} else {
				err = e.m.CopyDtoH(buf, p, s)
			}
			require.NoError(t, err, "the copy finished before the stream went")
			require.NoError(t, <-destroyed)
			assert.Nil(t, fatal.Load(), "a destroyed stream's handle reached the driver")
		})
	}
}

// An asynchronous pageable copy is checked against the capture rules in the steady state it is made in.
// A GLOBAL capture begun on another thread after the copy was validated (here, as it asks whether the
// memory is pinned) is refused there, before the driver sees the copy: the refusal comes back as it is,
// not wrapped as a driver failure "during stream capture" that claims no capture was in progress (an
// adversarial tester's finding), and the capture goes on.
func TestAPageableCopyRefusedForACaptureBegunMeanwhileSaysSo(t *testing.T) {
	var hook atomic.Pointer[func()]
	_, _, other, copies := stagedCopies(t, cudasim.New(), func(uintptr, int) bool { run(&hook); return false })
	for _, c := range copies {
		t.Run(c.name, func(t *testing.T) {
			rival := newRivalCapture(other)
			begin := rival.begin // the copy is past its first check: another thread begins a capture
			hook.Store(&begin)
			err := c.copy()
			requireResult(t, cuda.ErrorStreamCaptureUnsupported, err)
			assert.Contains(t, err.Error(), "an asynchronous copy of pageable memory")
			assert.NotContains(t, err.Error(), "failed during stream capture")
			require.NoError(t, rival.end(), "the capture went on")
		})
	}
}

// roundTrip copies want to p and back on s (nil: synchronously), and says whether the bytes came back.
func roundTrip(m *Manager, p cuda.DevicePtr, want []byte, s *Stream) error {
	got := make([]byte, len(want))
	if err := m.CopyHtoD(p, bytes.Clone(want), s); err != nil {
		return err
	}
	if err := m.CopyDtoH(got, p, s); err != nil {
		return err
	}
	if !bytes.Equal(want, got) {
		return errors.New("bytes differ")
	}
	return nil
}

// waitCopiers waits for the copying goroutines of wg, failing t if they wait for each other for good (30 s),
// then fails t with the first error they sent on errs.
func waitCopiers(t *testing.T, wg *sync.WaitGroup, errs chan error) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the copies waited for each other for good")
	}
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// TestSyncDriverCopyWaitsWhereCapturesAllow: a synchronous host-to-device copy of pageable memory small
// enough for the driver's copy waits for the legacy stream afterwards wherever no capture forbids that on
// the calling thread (RELAXED anywhere, THREAD_LOCAL begun on another thread) and not where one does
// (GLOBAL, THREAD_LOCAL begun on this thread); either way the capture of a non-blocking stream goes on
// and ends with a graph, and the bytes arrive.
func TestSyncDriverCopyWaitsWhereCapturesAllow(t *testing.T) {
	cases := []struct {
		name      string
		mode      cuda.CaptureMode
		otherTh   bool // the capture begins on another OS thread
		wantsSync bool
	}{
		{"RELAXED here", cuda.CaptureModeRelaxed, false, true},
		{"RELAXED elsewhere", cuda.CaptureModeRelaxed, true, true},
		{"THREAD_LOCAL here", cuda.CaptureModeThreadLocal, false, false},
		{"THREAD_LOCAL elsewhere", cuda.CaptureModeThreadLocal, true, true},
		{"GLOBAL here", cuda.CaptureModeGlobal, false, false},
		{"GLOBAL elsewhere", cuda.CaptureModeGlobal, true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			runtime.LockOSThread() // a capture's thread rules
			defer runtime.UnlockOSThread()
			e := newStagingEnv(t, 4096, 2)
			e.m.opts.PageableDirectMax = 4096
			const n = 1000
			p := e.alloc(t, n)
			capturing := e.stream(t, true) // non-blocking: a synchronous copy is allowed meanwhile
			// The capture begins and ends on one thread (ending it on another is refused), this test's or
			// one other thread's; an error comes back here, where require may stop the test.
			onThread := func(fn func() error) error { return fn() }
			if c.otherTh {
				calls := make(chan func() error)
				results := make(chan error)
				go func() {
					runtime.LockOSThread()
					defer runtime.UnlockOSThread()
					for fn := range calls {
						results <- fn()
					}
				}()
				defer close(calls)
				onThread = func(fn func() error) error {
					calls <- fn
					return <-results
				}
			}
			require.NoError(t, onThread(func() error { return capturing.BeginCapture(c.mode) }))
			syncs := e.drv.Calls("cuStreamSynchronize")
			want := pattern(n, 7)
			require.NoError(t, e.m.CopyHtoD(p, bytes.Clone(want), nil))
			waited := e.drv.Calls("cuStreamSynchronize") > syncs
			assert.Equal(t, c.wantsSync, waited, "the legacy stream's synchronize after the driver's copy")
			var g *Graph
			require.NoError(t, onThread(func() (err error) {
				g, err = capturing.EndCapture()
				return err
			}), "the copy left the capture going")
			require.NoError(t, g.Destroy())
			got := make([]byte, n)
			require.NoError(t, e.m.CopyDtoH(got, p, nil))
			assert.Equal(t, want, got)
		})
	}
}
