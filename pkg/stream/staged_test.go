package stream

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
)

// lazyGPU is the simulator with asynchronous host copies that run later, as a GPU runs them: a DMA
// enqueued on a stream runs, in stream order, only when something waits for it (an event recorded after
// it is synchronized, its stream synchronized, a synchronous copy) or, one operation at a time, at random,
// when a query asks whether it is done. A staging buffer reused before its DMA read it, or copied out
// before its DMA landed, then shows as wrong bytes (and, under -race, as a race with the worker that
// touched it). Only the calls the staged copies and these tests make are modelled.
type lazyGPU struct {
	*cudasim.Driver
	mu     sync.Mutex
	rng    *rand.Rand
	queues map[cuda.Stream]*lazyQueue
	marks  map[cuda.Event]lazyMark
	failed error // the first failure of an operation run late
	// mostQueued is the most bytes of copies enqueued on one stream and not yet run, seen as each was
	// enqueued.
	mostQueued int

	// Faults of the wrapper's own (the simulator's InjectFault fails a DMA when it runs, here late):
	// the nth call from now of an entry point fails with code before anything is enqueued.
	faults map[string]*lazyFault
	// onSync, if set, runs (outside the lock) at each EventSynchronize before it waits.
	onSync atomic.Pointer[func()]
	// stalled: queries make no progress (only a synchronize runs what it waits for).
	stalled atomic.Bool
}

type lazyQueue struct {
	ops   []func() error
	bytes []int // what each op copies
	done  int   // ops run so far
}

type lazyMark struct {
	s    cuda.Stream
	upTo int // the event completes once this many ops of s have run
}

type lazyFault struct {
	nth  int
	code cuda.Result
}

func newLazyGPU(seed uint64) *lazyGPU {
	return &lazyGPU{Driver: cudasim.New(), rng: rand.New(rand.NewPCG(seed, 7)),
		queues: map[cuda.Stream]*lazyQueue{}, marks: map[cuda.Event]lazyMark{}, faults: map[string]*lazyFault{}}
}

// fault makes the nth call from now of entry (MemcpyHtoDAsync, MemcpyDtoHAsync, EventSynchronize,
// EventQuery or EventRecord) fail
// with code.
func (d *lazyGPU) fault(entry string, nth int, code cuda.Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.faults[entry] = &lazyFault{nth, code}
}

func (d *lazyGPU) clearFaults() {
	d.mu.Lock()
	defer d.mu.Unlock()
	clear(d.faults)
}

func (d *lazyGPU) faultLocked(entry string) error {
	f := d.faults[entry]
	if f == nil {
		return nil
	}
	if f.nth--; f.nth > 0 {
		return nil
	}
	delete(d.faults, entry)
	return cuda.NewError(entry, f.code, "injected by lazyGPU")
}

func (d *lazyGPU) queue(s cuda.Stream) *lazyQueue {
	q := d.queues[s]
	if q == nil {
		q = &lazyQueue{}
		d.queues[s] = q
	}
	return q
}

// runLocked runs s's ops until upTo of them have run.
func (d *lazyGPU) runLocked(s cuda.Stream, upTo int) {
	q := d.queue(s)
	for q.done < min(upTo, len(q.ops)) {
		if err := q.ops[q.done](); err != nil && d.failed == nil {
			d.failed = err
		}
		q.ops[q.done] = nil
		q.done++
	}
}

func (d *lazyGPU) runAllLocked() {
	for s, q := range d.queues {
		d.runLocked(s, len(q.ops))
	}
}

func (d *lazyGPU) enqueue(entry string, s cuda.Stream, n int, op func() error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.faultLocked(entry); err != nil {
		return err
	}
	q := d.queue(s)
	q.ops = append(q.ops, op)
	q.bytes = append(q.bytes, n)
	queued := 0
	for _, b := range q.bytes[q.done:] {
		queued += b
	}
	d.mostQueued = max(d.mostQueued, queued)
	return nil
}

func (d *lazyGPU) MemcpyHtoDAsync(c cuda.Context, dst cuda.DevicePtr, src []byte, s cuda.Stream) error {
	return d.enqueue("MemcpyHtoDAsync", s, len(src), func() error { return d.Driver.MemcpyHtoDAsync(c, dst, src, s) })
}

func (d *lazyGPU) MemcpyDtoHAsync(c cuda.Context, dst []byte, src cuda.DevicePtr, s cuda.Stream) error {
	return d.enqueue("MemcpyDtoHAsync", s, len(dst), func() error { return d.Driver.MemcpyDtoHAsync(c, dst, src, s) })
}

// queuedMost returns mostQueued and starts it again from 0.
func (d *lazyGPU) queuedMost() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := d.mostQueued
	d.mostQueued = 0
	return m
}

func (d *lazyGPU) EventRecord(c cuda.Context, e cuda.Event, s cuda.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.faultLocked("EventRecord"); err != nil {
		return err
	}
	if err := d.Driver.EventRecord(c, e, s); err != nil {
		return err
	}
	d.marks[e] = lazyMark{s, len(d.queue(s).ops)}
	return nil
}

func (d *lazyGPU) EventQuery(c cuda.Context, e cuda.Event) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.faultLocked("EventQuery"); err != nil {
		return err
	}
	if m, ok := d.marks[e]; ok {
		q := d.queue(m.s)
		if q.done < m.upTo {
			if !d.stalled.Load() && d.rng.IntN(2) == 0 {
				d.runLocked(m.s, q.done+1)
			}
			if q.done < m.upTo {
				return cuda.NewError("cuEventQuery", cuda.ErrorNotReady, "not ready (lazyGPU)")
			}
		}
	}
	return d.Driver.EventQuery(c, e)
}

func (d *lazyGPU) EventSynchronize(c cuda.Context, e cuda.Event) error {
	if f := d.onSync.Load(); f != nil {
		(*f)()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.faultLocked("EventSynchronize"); err != nil {
		return err
	}
	if m, ok := d.marks[e]; ok {
		d.runLocked(m.s, m.upTo)
	}
	return d.Driver.EventSynchronize(c, e)
}

func (d *lazyGPU) StreamSynchronize(c cuda.Context, s cuda.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.runLocked(s, len(d.queue(s).ops))
	return d.Driver.StreamSynchronize(c, s)
}

func (d *lazyGPU) StreamQuery(c cuda.Context, s cuda.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	q := d.queue(s)
	if !d.stalled.Load() {
		d.runLocked(s, q.done+1)
	}
	if q.done < len(q.ops) {
		return cuda.NewError("cuStreamQuery", cuda.ErrorNotReady, "not ready (lazyGPU)")
	}
	return d.Driver.StreamQuery(c, s)
}

func (d *lazyGPU) StreamDestroy(c cuda.Context, s cuda.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.runLocked(s, len(d.queue(s).ops))
	delete(d.queues, s)
	return d.Driver.StreamDestroy(c, s)
}

// MemcpyHtoD is the driver's synchronous copy from pageable memory as documented: the work queued before
// it runs first, src is staged (copied) at once, and the call returns before the DMA, which lands later, in
// order on the legacy stream.
func (d *lazyGPU) MemcpyHtoD(c cuda.Context, dst cuda.DevicePtr, src []byte) error {
	d.mu.Lock()
	d.runAllLocked()
	d.mu.Unlock()
	staged := bytes.Clone(src)
	return d.enqueue("MemcpyHtoD", cuda.StreamLegacy, len(src), func() error { return d.Driver.MemcpyHtoD(c, dst, staged) })
}

func (d *lazyGPU) MemcpyDtoH(c cuda.Context, dst []byte, src cuda.DevicePtr) error {
	d.mu.Lock()
	d.runAllLocked()
	d.mu.Unlock()
	return d.Driver.MemcpyDtoH(c, dst, src)
}

// lateFailure returns the first failure of an operation the wrapper ran late.
func (d *lazyGPU) lateFailure() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.failed
}

// newLazyEnv is newEnv on a lazyGPU, with the staging tuning st.
func newLazyEnv(t *testing.T, seed uint64, st StagingTuning) (*env, *lazyGPU) {
	t.Helper()
	gpu := newLazyGPU(seed)
	e := newEnvOn(t, gpu.Driver, gpu)
	e.m.staging = newStaging(e.m, st)
	t.Cleanup(func() { assert.NoError(t, gpu.lateFailure(), "an operation run late failed") })
	return e, gpu
}

// settle waits until the goroutines of the process are back to at most n: a copy's workers have all
// returned some time after the copy did.
func settle(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > n && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	assert.LessOrEqual(t, runtime.NumGoroutine(), n, "goroutines left behind by the copies")
}

// TestPlan: a copy is cut into chunks of one staging buffer and pieces that never straddle them.
func TestPlan(t *testing.T) {
	cases := []struct {
		n, chunk, piece      int
		chunks, pieces, per  int
		lastChunk, lastPiece int
	}{
		{1, 4096, 4096, 1, 1, 1, 1, 1},
		{4096, 4096, 4096, 1, 1, 1, 4096, 4096},
		{4097, 4096, 4096, 2, 2, 1, 1, 1},
		{4097, 4096, 1024, 2, 5, 4, 1, 1},
		{10000, 4096, 1500, 3, 8, 3, 1808, 308}, // pieces of 1500, 1500, 1096 bytes; the last chunk 1500, 308
		{3 << 20, 1 << 20, 1 << 20, 3, 3, 1, 1 << 20, 1 << 20},
		{5 << 20, 4 << 20, 8 << 20, 2, 2, 1, 1 << 20, 1 << 20}, // a piece is at most a chunk
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("n=%d/chunk=%d/piece=%d", c.n, c.chunk, c.piece), func(t *testing.T) {
			p := newPlan(c.n, c.chunk, c.piece)
			assert.Equal(t, c.chunks, p.chunks, "chunks")
			assert.Equal(t, c.pieces, p.pieces, "pieces")
			assert.Equal(t, c.per, p.perChunk, "pieces per full chunk")
			_, last := p.chunkSpan(p.chunks - 1)
			assert.Equal(t, c.lastChunk, last, "last chunk")
			_, _, lastPiece := p.pieceSpan(p.pieces - 1)
			assert.Equal(t, c.lastPiece, lastPiece, "last piece")
		})
	}
	assert.Zero(t, newPlan(0, 4096, 4096).pieces, "nothing to copy: no piece")
}

// checkPlan asserts that p's pieces tile [0, n) in order, each inside its chunk, each chunk's pieces
// counted by piecesOf.
func checkPlan(t *testing.T, p plan) {
	t.Helper()
	next := 0
	per := make([]int, p.chunks)
	for i := range p.pieces {
		c, off, n := p.pieceSpan(i)
		coff, cn := p.chunkSpan(c)
		require.True(t, c >= 0 && c < p.chunks, "piece %d: chunk %d of %d", i, c, p.chunks)
		require.Positive(t, n, "piece %d is empty", i)
		require.LessOrEqual(t, n, p.piece, "piece %d", i)
		require.LessOrEqual(t, off+n, cn, "piece %d leaves chunk %d", i, c)
		require.LessOrEqual(t, cn, p.chunk, "chunk %d", c)
		require.Equal(t, next, coff+off, "piece %d does not follow the one before", i)
		next += n
		per[c]++
	}
	require.Equal(t, p.n, next, "the pieces cover the copy")
	for c := range p.chunks {
		require.Equal(t, p.piecesOf(c), per[c], "chunk %d", c)
	}
}

// FuzzPlan: for any size, chunk and piece, the pieces tile the copy exactly, in order, none straddling
// a chunk.
func FuzzPlan(f *testing.F) {
	f.Add(uint32(1), uint32(4096), uint32(4096))
	f.Add(uint32(10000), uint32(4096), uint32(1500))
	f.Add(uint32(5<<20), uint32(4<<20), uint32(1<<20))
	f.Fuzz(func(t *testing.T, n, chunk, piece uint32) {
		nn, cc, pp := int(n%(64<<20)), 1+int(chunk%(8<<20)), 1+int(piece%(8<<20))
		if nn == 0 || nn/cc > 1<<16 {
			return // nothing to copy, or too many chunks to walk quickly
		}
		checkPlan(t, newPlan(nn, cc, pp))
	})
}

// crewCopy copies src into dst (of the same length) as a staged copy's crew does, with dst standing for
// the staging buffers: every chunk is handed to the crew at once.
func crewCopy(dst, src []byte, st StagingTuning) {
	p := newPlan(len(src), st.Chunk, st.Piece)
	w := newCrew(p, src, true, st.Workers)
	for c := range p.chunks {
		off, n := p.chunkSpan(c)
		w.ready(c, dst[off:off+n])
	}
	for c := range p.chunks {
		w.waitDone(c)
	}
	w.halt()
}

// TestCrewCopies: a crew copies every byte once, whatever the split, with more workers than pieces and
// down to one (the caller).
func TestCrewCopies(t *testing.T) {
	withProcs(t, 8)
	cases := []struct {
		n  int
		st StagingTuning
	}{
		{1, StagingTuning{Chunk: 4096, Piece: 4096, Workers: 8}},
		{4096, StagingTuning{Chunk: 4096, Piece: 4096, Workers: 8}},
		{3*4096 + 1, StagingTuning{Chunk: 4096, Piece: 4096, Workers: 2}},
		{100000, StagingTuning{Chunk: 16384, Piece: 4096, Workers: 8}},
		{100000, StagingTuning{Chunk: 16384, Piece: 5000, Workers: 3}},
		{100000, StagingTuning{Chunk: 16384, Piece: 4096, Workers: 1}},
		{1 << 20, StagingTuning{Chunk: 256 << 10, Piece: 64 << 10, Workers: 64}},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("n=%d/%+v", c.n, c.st), func(t *testing.T) {
			src := pattern(c.n, 3)
			dst := make([]byte, c.n+8) // bytes past the end stay untouched
			crewCopy(dst[:c.n], src, c.st)
			assert.True(t, bytes.Equal(src, dst[:c.n]))
			assert.Equal(t, make([]byte, 8), dst[c.n:])
		})
	}
}

// lazyTunings are the staging settings the lazy-GPU tests run: the caller copying alone, crews sharing
// chunks of several pieces, a pool of one buffer, and more buffers than the copies have chunks.
var lazyTunings = []StagingTuning{
	{Chunk: 4096, Buffers: 2, Workers: 1},
	{Chunk: 4096, Buffers: 1, Workers: 1},
	{Chunk: 16 << 10, Buffers: 3, Workers: 4, Piece: 4096},
	{Chunk: 16 << 10, Buffers: 1, Workers: 8, Piece: 4096},
	{Chunk: 8192, Buffers: 4, Workers: 3, Piece: 5000, Burst: -1},
	{Chunk: 64 << 10, Buffers: 16, Workers: 2, Piece: 4096},
	{Chunk: 4096, Buffers: 6, Workers: 4, Burst: 4096},
	{Chunk: 8192, Buffers: 8, Workers: 8, Piece: 4096, Burst: 3 * 8192},
}

// TestSyncCopyHasLandedWhenItReturns: a synchronous host-to-device copy small enough for the driver's own
// copy, whose DMA the driver leaves on the legacy stream after it returns, has landed when CopyHtoD
// returns: a copy to the host on a non-blocking stream right after it reads the new bytes.
func TestSyncCopyHasLandedWhenItReturns(t *testing.T) {
	e, gpu := newLazyEnv(t, 11, StagingTuning{})
	e.m.opts.PageableDirectMax = 1 << 20 // the default: these go to the driver's copy
	for _, n := range []int{1, 7, 4096, 64 << 10} {
		p := e.alloc(t, n)
		want := pattern(n, byte(n))
		require.NoError(t, e.m.CopyHtoD(p, bytes.Clone(want), nil))
		// What the device holds now, read past the lazy queues (as a kernel on another stream would).
		got := make([]byte, n)
		require.NoError(t, gpu.Driver.MemcpyDtoH(e.m.ctx, got, p))
		assert.True(t, bytes.Equal(want, got), "%d bytes: the copy had not landed", n)
	}
}

// TestStagedBurstBoundsTheQueue: a staged copy, either way, never has more than its burst (and at most one
// chunk beyond, when the burst is not a whole number of chunks) queued for the copy engine and not yet
// run; with draining off it queues up to its pool. Every byte arrives.
func TestStagedBurstBoundsTheQueue(t *testing.T) {
	withProcs(t, 8)
	const chunk = 4096
	cases := []struct {
		burst, most int
	}{
		{chunk, chunk},
		{2 * chunk, 2 * chunk},
		{2*chunk + 1, 3 * chunk},
		{5 * chunk, 5 * chunk},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("burst=%d", c.burst), func(t *testing.T) {
			st := StagingTuning{Chunk: chunk, Buffers: 8, Workers: 4, Burst: c.burst}
			e, gpu := newLazyEnv(t, uint64(c.burst), st)
			s := e.stream(t, true)
			n := 24*chunk + 5
			p := e.alloc(t, n)
			want := pattern(n, 3)
			gpu.queuedMost()
			require.NoError(t, e.m.CopyHtoD(p, bytes.Clone(want), s))
			assert.LessOrEqual(t, gpu.queuedMost(), c.most, "host to device")
			require.NoError(t, s.Synchronize()) // the last burst ran: the next copy's queue starts empty
			gpu.queuedMost()
			got := make([]byte, n)
			require.NoError(t, e.m.CopyDtoH(got, p, s))
			assert.LessOrEqual(t, gpu.queuedMost(), c.most, "device to host")
			assert.True(t, bytes.Equal(want, got), "bytes differ")
			require.NoError(t, s.Synchronize())
		})
	}
	// A stream whose queries never say done (it is busy with work from before the copy): the copy stops
	// asking after spinFor and waits for the burst in the driver, and still never queues more.
	t.Run("stalled", func(t *testing.T) {
		st := StagingTuning{Chunk: chunk, Buffers: 8, Workers: 4, Burst: 2 * chunk}
		e, gpu := newLazyEnv(t, 5, st)
		gpu.stalled.Store(true)
		s := e.stream(t, true)
		n := 6 * chunk
		p := e.alloc(t, n)
		want := pattern(n, 4)
		gpu.queuedMost()
		require.NoError(t, e.m.CopyHtoD(p, bytes.Clone(want), s))
		assert.LessOrEqual(t, gpu.queuedMost(), 2*chunk)
		got := make([]byte, n)
		require.NoError(t, e.m.CopyDtoH(got, p, s))
		assert.True(t, bytes.Equal(want, got), "bytes differ")
	})
}

// TestStagedOrderOnALazyGPU: on a GPU that runs DMAs late, staged copies both ways, one after another on
// one stream without a synchronize, land whole and in stream order: the last write wins, a read sees the
// writes before it, the source may be reused as soon as a host-to-device call returns, and every staging
// buffer comes back once the stream is done. Synchronous staged copies too.
func TestStagedOrderOnALazyGPU(t *testing.T) {
	withProcs(t, 8)
	before := runtime.NumGoroutine()
	for i, st := range lazyTunings {
		for _, n := range []int{1, st.Chunk - 1, st.Chunk, st.Chunk + 1, 5*st.Chunk + 17} {
			t.Run(fmt.Sprintf("%+v/n=%d", st, n), func(t *testing.T) {
				e, _ := newLazyEnv(t, uint64(i*1000+n), st)
				s := e.stream(t, true)
				p := e.alloc(t, n)
				for round := range 4 {
					var last []byte
					for k := range 3 {
						last = pattern(n, byte(16*round+k))
						src := bytes.Clone(last)
						require.NoError(t, e.m.CopyHtoD(p, src, s))
						for j := range src {
							src[j] = ^src[j] // read already: must not reach the device
						}
					}
					got := make([]byte, n)
					require.NoError(t, e.m.CopyDtoH(got, p, s))
					require.True(t, bytes.Equal(last, got), "round %d: bytes differ", round)
				}
				want := pattern(n, 99)
				require.NoError(t, e.m.CopyHtoD(p, bytes.Clone(want), nil)) // synchronous, staged
				got := make([]byte, n)
				require.NoError(t, e.m.CopyDtoH(got, p, nil))
				require.True(t, bytes.Equal(want, got), "synchronous: bytes differ")
				require.NoError(t, s.Synchronize())
				all, free, busy := poolState(e.m)
				assert.LessOrEqual(t, all, st.Buffers)
				assert.Zero(t, busy)
				assert.Equal(t, all, free, "every staging buffer is back")
			})
		}
	}
	settle(t, before)
}

// faultedCopy makes the nth call from now of entry fail and copies n bytes with host one way (dtoh: to the
// host) on s: the copy returns the typed error, or nothing when the fault came after its last call of that
// kind (then the fault is taken back). host is written right after the call returns, as the caller may:
// under -race a worker still copying it would show.
func faultedCopy(t *testing.T, e *env, gpu *lazyGPU, entry string, nth int, dtoh bool, p cuda.DevicePtr, host []byte, s *Stream) {
	t.Helper()
	gpu.fault(entry, nth, cuda.ErrorInvalidValue)
	var err error
	if dtoh {
		err = e.m.CopyDtoH(host, p, s)
	} else {
		err = e.m.CopyHtoD(p, host, s)
	}
	clear(host) // the caller's memory is the caller's again
	if err == nil {
		// The fault came after the copy's last call of that kind (a pool of one buffer waits more often
		// than it enqueues): nothing to check but the pool.
		gpu.clearFaults()
	} else {
		requireResult(t, cuda.ErrorInvalidValue, err)
	}
}

// requirePoolBack checks, once s is done, that every staging buffer is back in the pool.
func requirePoolBack(t *testing.T, e *env, s *Stream) {
	t.Helper()
	require.NoError(t, s.Synchronize())
	all, free, busy := poolState(e.m)
	assert.Zero(t, busy, "no staging buffer stays busy")
	assert.Equal(t, all, free, "every staging buffer is back")
}

// requirePoolWorks checks that a round trip of n bytes through p on s lands whole.
func requirePoolWorks(t *testing.T, e *env, p cuda.DevicePtr, n int, s *Stream) {
	t.Helper()
	want := pattern(n, 6)
	got := make([]byte, n)
	require.NoError(t, e.m.CopyHtoD(p, bytes.Clone(want), s), "the pool works again")
	require.NoError(t, e.m.CopyDtoH(got, p, s))
	require.True(t, bytes.Equal(want, got), "bytes differ after the failure")
}

// TestStagedFaultsOnALazyGPU: a failure midway through a staged copy whose chunks are in every state
// (filled and not enqueued, enqueued and not landed, landed and being copied out) returns the typed
// error once no worker touches the caller's memory (the test writes it right away: under -race a worker
// still copying would show), and leaves no staging buffer held: each comes back once what was enqueued
// into it has run, and the pool works afterwards.
func TestStagedFaultsOnALazyGPU(t *testing.T) {
	withProcs(t, 8)
	before := runtime.NumGoroutine()
	cases := []struct {
		entry string
		dtoh  bool
		nth   int
	}{
		{"MemcpyHtoDAsync", false, 1}, {"MemcpyHtoDAsync", false, 2}, {"MemcpyHtoDAsync", false, 4},
		{"EventSynchronize", false, 1}, // waiting for a buffer, the pool being all in flight
		{"MemcpyDtoHAsync", true, 2}, {"MemcpyDtoHAsync", true, 5},
		{"EventSynchronize", true, 1}, {"EventSynchronize", true, 3},
	}
	for i, st := range lazyTunings {
		for _, c := range cases {
			t.Run(fmt.Sprintf("%+v/%s/%d", st, c.entry, c.nth), func(t *testing.T) {
				e, gpu := newLazyEnv(t, uint64(i*100+c.nth), st)
				s := e.stream(t, true)
				n := 7*st.Chunk + 5
				p := e.alloc(t, n)
				host := pattern(n, 5)
				faultedCopy(t, e, gpu, c.entry, c.nth, c.dtoh, p, host, s)
				requirePoolBack(t, e, s)
				requirePoolWorks(t, e, p, n, s)
			})
		}
	}
	settle(t, before)
}

// TestStagedBurstFaults: a failure of the query or the record of a burst's drain event midway through a
// staged copy with bursts, either way, returns the typed error once no worker touches the caller's memory,
// and leaves neither a staging buffer held nor an event lost: every event the pool created is back in it.
func TestStagedBurstFaults(t *testing.T) {
	withProcs(t, 8)
	const chunk = 4096
	st := StagingTuning{Chunk: chunk, Buffers: 6, Workers: 4, Burst: chunk}
	for _, entry := range []string{"EventQuery", "EventRecord"} {
		for _, dtoh := range []bool{false, true} {
			for nth := 1; nth <= 9; nth += 2 {
				t.Run(fmt.Sprintf("%s/dtoh=%v/%d", entry, dtoh, nth), func(t *testing.T) {
					e, gpu := newLazyEnv(t, uint64(nth), st)
					s := e.stream(t, true)
					n := 12*chunk + 5
					p := e.alloc(t, n)
					host := pattern(n, 5)
					created := e.drv.Calls("cuEventCreate")
					faultedCopy(t, e, gpu, entry, nth, dtoh, p, host, s)
					requirePoolBack(t, e, s)
					e.m.staging.mu.Lock()
					events := len(e.m.staging.events)
					e.m.staging.mu.Unlock()
					assert.Equal(t, e.drv.Calls("cuEventCreate")-created, events, "every event is back in the pool")
					requirePoolWorks(t, e, p, n, s)
				})
			}
		}
	}
}

// TestStagedCopiesShareThePool: staged copies on several streams at once, both ways, with a pool smaller
// than what they would take alone, never wait for each other for good, land intact, and leave the pool
// within its bound with every buffer back.
func TestStagedCopiesShareThePool(t *testing.T) {
	withProcs(t, 8)
	const threads, rounds = 6, 12
	for i, st := range lazyTunings {
		t.Run(fmt.Sprintf("%+v", st), func(t *testing.T) {
			e, _ := newLazyEnv(t, uint64(i), st)
			n := 3*st.Chunk + 7
			var wg sync.WaitGroup
			errs := make(chan error, threads)
			for th := range threads {
				s := e.stream(t, true)
				p := e.alloc(t, n)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for r := range rounds {
						size := 1 + (th*rounds+r)*977%n
						if err := roundTrip(e.m, p, pattern(size, byte(th+r)), s); err != nil {
							errs <- fmt.Errorf("thread %d round %d: %w", th, r, err)
							return
						}
					}
				}()
			}
			waitCopiers(t, &wg, errs)
			_, err := e.m.SynchronizeDevice(0, true)
			require.NoError(t, err)
			all, free, busy := poolState(e.m)
			assert.LessOrEqual(t, all, st.Buffers)
			assert.Zero(t, busy)
			assert.Equal(t, all, free, "every staging buffer is back")
		})
	}
}

// TestOtherStreamsGoOnDuringAStagedCopy: while a staged copy waits on the GPU (its oldest chunk's DMA
// has not landed), copies on other streams are not held up: a pinned copy each way, and a pageable one
// small enough for the driver's own pageable copy, complete before the staged copy does.
func TestOtherStreamsGoOnDuringAStagedCopy(t *testing.T) {
	withProcs(t, 8)
	st := StagingTuning{Chunk: 16 << 10, Buffers: 3, Workers: 4, Piece: 4096}
	for _, dir := range []string{"HtoD", "DtoH"} {
		t.Run(dir, func(t *testing.T) {
			e, gpu := newLazyEnv(t, 1, st)
			e.m.opts.PageableDirectMax = 4096
			s, other := e.stream(t, true), e.stream(t, true)
			const n = 10 * (16 << 10)
			p, q := e.alloc(t, n), e.alloc(t, 4096)
			pin := e.pinned(t, 4096)
			held, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			hook := func() { // the staged copy's first wait on the GPU: hold it there
				once.Do(func() { close(held); <-release })
			}
			gpu.onSync.Store(&hook)
			gpu.stalled.Store(true) // the staged copy's DMAs land only when it waits for them
			staged := make(chan error, 1)
			host := pattern(n, 1)
			go func() {
				if dir == "HtoD" {
					staged <- e.m.CopyHtoD(p, host, s)
				} else {
					staged <- e.m.CopyDtoH(host, p, s)
				}
			}()
			select {
			case <-held:
			case err := <-staged:
				t.Fatalf("the staged copy never waited on the GPU (returned %v)", err)
			}
			gpu.onSync.Store(nil)
			others := make(chan error, 1)
			go func() {
				copy(pin, pattern(4096, 2))
				if err := e.m.CopyHtoD(q, pin, other); err != nil {
					others <- err
					return
				}
				if err := e.m.CopyDtoH(pin, q, other); err != nil {
					others <- err
					return
				}
				if err := e.m.CopyHtoD(q, pattern(4096, 3), other); err != nil { // the driver's pageable copy
					others <- err
					return
				}
				others <- other.Synchronize()
			}()
			select {
			case err := <-others:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("another stream's copies waited for the staged copy")
			}
			select {
			case err := <-staged:
				t.Fatalf("the staged copy finished while held (%v)", err)
			default:
			}
			gpu.stalled.Store(false)
			close(release)
			require.NoError(t, <-staged)
			require.NoError(t, s.Synchronize())
			got := make([]byte, 4096)
			require.NoError(t, e.m.CopyDtoH(got, q, other))
			assert.Equal(t, pattern(4096, 3), got)
		})
	}
}

// TestStagingTuning: SetStagingTuning validates, applies (the pool's buffers freed, the next copy
// allocating them at the new size), fills zero fields with the defaults, and refuses while a staged copy
// runs.
func TestStagingTuning(t *testing.T) {
	e := newEnv(t)
	s := e.stream(t, true)
	bad := []StagingTuning{
		{Chunk: 100}, {Chunk: 2 << 30}, {Buffers: -1}, {Buffers: 1000}, {Workers: -2}, {Workers: 1000}, {Piece: 10}, {Burst: 100},
	}
	for _, b := range bad {
		t.Run(fmt.Sprintf("refused %+v", b), func(t *testing.T) {
			requireResult(t, cuda.ErrorInvalidValue, e.m.SetStagingTuning(b))
		})
	}
	assert.Equal(t, StagingTuning{Chunk: 4096, Buffers: 2, Workers: DefaultCopyWorkers, Piece: 4096, Burst: DefaultStagingBurst}, e.m.StagingTuning())
	const n = 5*8192 + 3
	p := e.alloc(t, n)
	require.NoError(t, e.m.CopyHtoD(p, pattern(n, 1), s))
	require.NoError(t, s.Synchronize())
	allocs, frees := e.drv.Calls("cuMemHostAlloc"), e.drv.Calls("cuMemFreeHost")
	all, _, _ := poolState(e.m)
	require.NoError(t, e.m.SetStagingTuning(StagingTuning{Chunk: 8192, Buffers: 3, Workers: 2, Burst: -1}))
	assert.Equal(t, frees+all, e.drv.Calls("cuMemFreeHost"), "the old buffers are freed")
	assert.Equal(t, StagingTuning{Chunk: 8192, Buffers: 3, Workers: 2, Piece: 8192, Burst: -1}, e.m.StagingTuning())
	assert.Zero(t, e.m.StagingBytes())
	got := make([]byte, n)
	require.NoError(t, e.m.CopyHtoD(p, pattern(n, 2), s))
	require.NoError(t, e.m.CopyDtoH(got, p, s))
	assert.Equal(t, pattern(n, 2), got)
	assert.Equal(t, allocs+3, e.drv.Calls("cuMemHostAlloc"), "three new buffers")
	assert.Equal(t, uint64(3*8192), e.m.StagingBytes())
	require.NoError(t, e.m.SetStagingTuning(StagingTuning{}))
	assert.Equal(t, StagingTuning{Chunk: DefaultStagingSize, Buffers: DefaultStagingCount, Workers: DefaultCopyWorkers,
		Piece: DefaultCopyPiece, Burst: DefaultStagingBurst}, e.m.StagingTuning(), "zero fields: the defaults")

	t.Run("refused while a copy runs", func(t *testing.T) {
		require.NoError(t, e.m.SetStagingTuning(StagingTuning{Chunk: 4096, Buffers: 1}))
		e.m.staging.begin() // a staged copy is running
		err := e.m.SetStagingTuning(StagingTuning{Chunk: 8192})
		e.m.staging.end()
		requireResult(t, cuda.ErrorNotReady, err)
		assert.Equal(t, 4096, e.m.StagingTuning().Chunk, "unchanged")
		require.NoError(t, e.m.SetStagingTuning(StagingTuning{Chunk: 8192}), "and applied once it is done")
	})
	t.Run("refused during a capture", func(t *testing.T) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		c := e.stream(t, true)
		require.NoError(t, c.BeginCapture(cuda.CaptureModeRelaxed))
		requireResult(t, cuda.ErrorStreamCaptureUnsupported, e.m.SetStagingTuning(StagingTuning{Chunk: 8192}))
		g, err := c.EndCapture()
		require.NoError(t, err)
		require.NoError(t, g.Destroy())
	})
}

// BenchmarkCrewCopy compares, on this host, the host half of a staged copy alone: 64 MiB copied in
// chunks with the crew kept across chunks (as the pipeline runs it) against one crew per chunk waited for
// before the next (each chunk's slowest piece and the crew's start paid per chunk, as before the
// pipeline). The CPU-side part of the question only: no DMA competes for host memory here.
func BenchmarkCrewCopy(b *testing.B) {
	const n = 64 << 20
	src, dst := pattern(n, 1), make([]byte, n)
	for _, st := range []StagingTuning{
		{Chunk: 4 << 20, Piece: 1 << 20, Workers: 2},
		{Chunk: 8 << 20, Piece: 256 << 10, Workers: 2},
		{Chunk: 4 << 20, Piece: 1 << 20, Workers: 8},
	} {
		b.Run(fmt.Sprintf("pipelined/%+v", st), func(b *testing.B) {
			b.SetBytes(n)
			for b.Loop() {
				crewCopy(dst, src, st)
			}
		})
		b.Run(fmt.Sprintf("per-chunk/%+v", st), func(b *testing.B) {
			b.SetBytes(n)
			for b.Loop() {
				for off := 0; off < n; off += st.Chunk {
					crewCopy(dst[off:off+st.Chunk], src[off:off+st.Chunk], st)
				}
			}
		})
	}
}

// FuzzStagedCopy: any size, chunk, pool, crew and piece, on a GPU that runs DMAs late in an order the
// seed picks: a staged copy each way lands every byte at its offset, and every staging buffer comes back.
func FuzzStagedCopy(f *testing.F) {
	f.Add(uint32(5*4096+17), uint16(4096), uint8(2), uint8(1), uint16(4096), uint64(1))
	f.Add(uint32(100000), uint16(16384), uint8(3), uint8(4), uint16(4096), uint64(2))
	f.Add(uint32(65537), uint16(8192), uint8(1), uint8(8), uint16(5000), uint64(3))
	f.Add(uint32(1), uint16(0), uint8(0), uint8(0), uint16(0), uint64(4))
	f.Fuzz(func(t *testing.T, n uint32, chunk uint16, buffers, workers uint8, piece uint16, seed uint64) {
		st := StagingTuning{
			Chunk:   minStagingChunk + int(chunk)%(60<<10),
			Buffers: 1 + int(buffers)%6,
			Workers: 1 + int(workers)%8,
			Piece:   minCopyPiece + int(piece)%(16<<10),
			Burst:   []int{-1, 0, minCopyPiece, 3 * minCopyPiece, 64 << 10}[seed%5],
		}
		size := 1 + int(n)%(1<<20)
		if size/st.Chunk > 300 {
			return // too many chunks for a quick case
		}
		withProcs(t, 8)
		e, _ := newLazyEnv(t, seed, st)
		s := e.stream(t, true)
		p := e.alloc(t, size)
		want := pattern(size, byte(seed))
		require.NoError(t, e.m.CopyHtoD(p, bytes.Clone(want), s))
		got := make([]byte, size)
		require.NoError(t, e.m.CopyDtoH(got, p, s))
		require.True(t, bytes.Equal(want, got), "%+v, %d bytes: bytes differ", st, size)
		require.NoError(t, s.Synchronize())
		all, free, busy := poolState(e.m)
		require.LessOrEqual(t, all, st.Buffers)
		require.Equal(t, all, free, "every staging buffer is back")
		require.Zero(t, busy)
	})
}

// TestStagingBufferAllocationFails: a staging buffer that cannot be allocated (pinned memory exhausted)
// fails no copy. With buffers in the pool the copy goes on with them, and the pool grows no further
// until memory is given back (ReleaseStaging); with none it is the driver's own pageable copy (which
// needs no pinned memory of cudacore's), asynchronous or synchronous, either way. Every byte arrives, and
// every buffer the pool has comes back.
func TestStagingBufferAllocationFails(t *testing.T) {
	const n = 5*4096 + 3 // five chunks and a bit, for a pool of two
	cases := []struct {
		name   string
		dtoh   bool
		sync   bool
		before int // buffers allocated before the fault
		nth    int // the allocation from then on that fails
		pool   int // buffers in the pool after the copy
	}{
		{"HtoD/stream/none", false, false, 0, 1, 0},
		{"HtoD/sync/none", false, true, 0, 1, 0},
		{"DtoH/stream/none", true, false, 0, 1, 0},
		{"DtoH/sync/none", true, true, 0, 1, 0},
		{"HtoD/stream/one", false, false, 1, 1, 1},
		{"HtoD/sync/one", false, true, 1, 1, 1},
		{"DtoH/stream/one", true, false, 1, 1, 1},
		{"DtoH/sync/one", true, true, 1, 1, 1},
		{"HtoD/stream/second of this copy", false, false, 0, 2, 1},
		{"DtoH/stream/second of this copy", true, false, 0, 2, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t) // a pool of two 4 KiB buffers, every pageable copy staged
			s := e.stream(t, true)
			p := e.alloc(t, n)
			if c.before > 0 {
				require.NoError(t, e.m.CopyHtoD(p, pattern(4096, 9), s)) // one chunk: one buffer
				require.NoError(t, s.Synchronize())
			}
			var cs *Stream
			if !c.sync {
				cs = s
			}
			want := pattern(n, 1)
			if c.dtoh { // the driver's copy: the pool stays as it is
				require.NoError(t, e.drv.MemcpyHtoD(e.dev.Context(), p, want))
			}
			e.drv.InjectFault("cuMemHostAlloc", c.nth, cuda.ErrorOutOfMemory)
			got := make([]byte, n)
			if c.dtoh {
				require.NoError(t, e.m.CopyDtoH(got, p, cs))
			} else {
				require.NoError(t, e.m.CopyHtoD(p, want, cs))
			}
			assert.Zero(t, e.drv.ClearFaults(), "the allocation failed")
			require.NoError(t, s.Synchronize())
			if !c.dtoh { // the driver's copy: the pool stays as it is
				require.NoError(t, e.drv.MemcpyDtoH(e.dev.Context(), got, p))
			}
			assert.Equal(t, want, got)
			all, free, busy := poolState(e.m)
			assert.Equal(t, c.pool, all, "buffers in the pool")
			assert.Equal(t, all, free, "every buffer is back")
			assert.Zero(t, busy)
			// Memory given back: the pool grows to its bound again.
			require.NoError(t, e.m.ReleaseStaging())
			require.NoError(t, e.m.CopyHtoD(p, want, s))
			require.NoError(t, s.Synchronize())
			all, _, _ = poolState(e.m)
			assert.Equal(t, 2, all, "the pool grows again once memory was released")
		})
	}
}

// TestStagingAllocationFailsUnderContention: copies on several streams at once, with every other
// staging allocation failing, never wait for each other for good and land intact.
func TestStagingAllocationFailsUnderContention(t *testing.T) {
	withProcs(t, 8)
	const threads, rounds, n = 6, 20, 7*4096 + 5
	e := newEnv(t)
	require.NoError(t, e.m.SetStagingTuning(StagingTuning{Chunk: 4096, Buffers: 4, Workers: 2}))
	for i := 1; i < 200; i += 2 {
		e.drv.InjectFault("cuMemHostAlloc", i, cuda.ErrorOutOfMemory)
	}
	var wg sync.WaitGroup
	errs := make(chan error, threads)
	for th := range threads {
		s := e.stream(t, true)
		p := e.alloc(t, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				want, got := pattern(n, byte(th*rounds+r)), make([]byte, n)
				if err := e.m.CopyHtoD(p, want, s); err != nil {
					errs <- err
					return
				}
				if err := e.m.CopyDtoH(got, p, s); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(want, got) {
					errs <- fmt.Errorf("thread %d round %d: bytes differ", th, r)
					return
				}
				if r%5 == 4 {
					if err := e.m.ReleaseStaging(); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	waitCopiers(t, &wg, errs)
	e.drv.ClearFaults()
	_, err := e.m.SynchronizeDevice(0, true)
	require.NoError(t, err)
	all, free, busy := poolState(e.m)
	assert.LessOrEqual(t, all, 4)
	assert.Zero(t, busy)
	assert.Equal(t, all, free, "every staging buffer is back")
}

// BenchmarkCrewStart asks, on this host, what a copy of a few chunks pays for starting its crew: the host
// half of a staged copy of 16 and 64 MiB (as the pipeline runs it, a crew started per copy), against the
// same pieces copied by workers that are already running and spin between copies, which is the most
// that keeping a crew warm could give. The gap is the crew's start (waking parked threads), which a copy
// of a few chunks pays against only a few hundred microseconds of copying.
func BenchmarkCrewStart(b *testing.B) {
	st := StagingTuning{Chunk: DefaultStagingSize, Piece: DefaultCopyPiece, Workers: DefaultCopyWorkers}
	for _, n := range []int{16 << 20, 64 << 20} {
		src, dst := pattern(n, 1), make([]byte, n)
		b.Run(fmt.Sprintf("crew/%dMiB", n>>20), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				crewCopy(dst, src, st)
			}
		})
		b.Run(fmt.Sprintf("spinning/%dMiB", n>>20), func(b *testing.B) {
			var round, next, done atomic.Int64
			var quit atomic.Bool
			pieces := n / st.Piece
			var wg sync.WaitGroup
			for range max(1, min(st.Workers, runtime.GOMAXPROCS(0)-1)) { // spinners need a core each
				wg.Add(1)
				go func() {
					defer wg.Done()
					seen := int64(0)
					for !quit.Load() {
						if r := round.Load(); r == seen {
							continue // spin: no parking between copies
						} else {
							seen = r
						}
						for {
							i := int(next.Add(1) - 1)
							if i >= pieces {
								break
							}
							copy(dst[i*st.Piece:(i+1)*st.Piece], src[i*st.Piece:(i+1)*st.Piece])
							done.Add(1)
						}
					}
				}()
			}
			b.SetBytes(int64(n))
			for b.Loop() {
				// done first: a worker still in the last round's loop that claims a piece once next is
				// reset counts it in this round, never in the last one's count that this reset drops.
				done.Store(0)
				next.Store(0)
				round.Add(1)
				for done.Load() < int64(pieces) {
				}
			}
			quit.Store(true)
			wg.Wait()
		})
	}
}
