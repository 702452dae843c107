package stream

import (
	"cmp"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// The staged copies of pageable memory: a pipeline over the staging pool.
//
// A staged copy is cut into chunks of one staging buffer (StagingTuning.Chunk bytes, the last one
// shorter) and each chunk into pieces of at most Piece bytes (pieces never straddle chunks). The calling
// goroutine drives the pipeline and is the only one that calls the driver; a crew of Workers goroutines,
// started once for the whole copy, copies the pieces between the caller's memory and the staging
// buffers, claiming them in order across chunk boundaries:
//
//   - host to device, the caller hands each chunk a buffer as the pool has one (up to Buffers chunks
//     ahead of the oldest chunk not yet enqueued), the crew fills it, and the caller enqueues the DMA of
//     each filled chunk, in order, followed by an event that returns the buffer to the pool;
//   - device to host, the caller enqueues the DMAs of up to Buffers chunks ahead, each into a buffer of
//     its own followed by an event, waits for them in order, hands each landed chunk to the crew, and
//     reuses a buffer for the next DMA once the crew has copied its chunk out.
//
// No worker waits at the end of a chunk for the others: a worker that finishes its piece takes the next
// one, of the next chunk if that one has its buffer. So the host side, which one core cannot drive at
// the copy engine's rate, runs with every worker busy while the DMAs of earlier chunks run, and the
// caller's driver calls (enqueue, record, wait) overlap the workers' copying instead of pausing it.
//
// Waiting never deadlocks: the caller blocks for a buffer (staging.get) only while it holds none that
// it has yet to enqueue or copy out, and otherwise asks the pool without waiting (staging.poll) and waits
// for its own oldest chunk, which its crew or the GPU completes by itself. Workers claim pieces in order,
// so a worker waiting for a chunk's buffer means every piece of the earlier chunks has a worker.
//
// When a copy fails midway, the caller stops the crew and waits until no worker touches either side
// before it returns: a buffer whose DMA was enqueued is busy until an event after it completes (or the
// stream is synchronized), and a buffer nothing was enqueued for goes straight back to the pool.

// StagingTuning is how a Manager stages pageable copies. The zero value of a field means its default.
type StagingTuning struct {
	// Chunk is the size of one staging buffer in bytes, the unit of one DMA.
	Chunk int
	// Buffers bounds the device's staging pool, and the chunks one copy holds at once.
	Buffers int
	// Workers is the number of goroutines that copy host memory for one staged copy (at most GOMAXPROCS,
	// and at most one per piece); 1 has the calling goroutine copy each chunk itself, between its driver
	// calls, as it does for a copy of one piece.
	Workers int
	// Piece is the most bytes a worker copies at a time (at most Chunk).
	Piece int
	// Burst is the most bytes one copy enqueues for the copy engine in one stretch: after that many it
	// lets its DMAs drain before it enqueues more, so that another stream's copies, which the engine
	// otherwise serves only once this copy's queue runs dry, get their turn. Negative: never drain.
	Burst int
}

// Defaults of StagingTuning, reasoned from the rates involved (a copy engine reading pinned memory moves
// several times what one core's memcpy does; driver-facts.md, "Pageable copies", has the figures), for the
// GPU sweep (scripts/gpu/pageable_probe.py) to confirm or move.
const (
	// DefaultStagingSize: a chunk's DMA lasts long against the caller's few driver calls per chunk (which
	// overlap the DMAs anyway), while the first chunk's fill and the last chunk's DMA, which nothing
	// overlaps, stay short against a copy of a few chunks.
	DefaultStagingSize = 4 << 20
	// DefaultStagingCount: 32 MiB of pinned memory per device, room for the chunks the workers fill at
	// once (Workers pieces) and several more queued for the copy engine, which absorbs the workers'
	// hiccups.
	DefaultStagingCount = 8
	// DefaultCopyWorkers: enough cores copying to keep up with the copy engine while it competes with them
	// for host memory bandwidth, with a margin, and most of a server's cores left to the rest of the
	// process.
	DefaultCopyWorkers = 8
	// DefaultCopyPiece: from 1 MiB, Go's memmove uses non-temporal stores on CPUs where it copies with AVX
	// (the destination is read once, by the DMA or by the caller, so caching it only costs memory
	// bandwidth); a chunk is a few pieces, shared by as many workers.
	DefaultCopyPiece = 1 << 20
	// DefaultStagingBurst: a copy engine fed without a pause serves one stream's queue until it runs dry,
	// so another stream's copy would wait for the whole staged copy; a drain every few chunks bounds that
	// wait to about one burst's DMAs, for the cost of one idle gap of the engine per burst.
	DefaultStagingBurst = 16 << 20
)

// Bounds of StagingTuning accepted by SetStagingTuning (absurd values are mistakes, not tuning).
const (
	minStagingChunk = 4 << 10
	maxStagingChunk = 1 << 30
	maxStagingCount = 256
	maxCopyWorkers  = 256
	minCopyPiece    = 4 << 10
)

// withDefaults fills the zero fields of t with the defaults.
func (t StagingTuning) withDefaults() StagingTuning {
	if t.Chunk <= 0 {
		t.Chunk = DefaultStagingSize
	}
	if t.Buffers <= 0 {
		t.Buffers = DefaultStagingCount
	}
	if t.Workers <= 0 {
		t.Workers = DefaultCopyWorkers
	}
	if t.Piece <= 0 {
		t.Piece = DefaultCopyPiece
	}
	if t.Burst == 0 {
		t.Burst = DefaultStagingBurst
	}
	t.Piece = min(t.Piece, t.Chunk)
	return t
}

// check refuses a tuning outside the bounds, with an InvalidValue error naming the field.
func (t StagingTuning) check(op string) error {
	bad := func(field string, v int, want string) error {
		return cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf("staging %s must be %s, got %d", field, want, v))
	}
	switch {
	case t.Chunk != 0 && (t.Chunk < minStagingChunk || t.Chunk > maxStagingChunk):
		return bad("chunk", t.Chunk, fmt.Sprintf("between %d and %d bytes (0: the default)", minStagingChunk, maxStagingChunk))
	case t.Buffers < 0 || t.Buffers > maxStagingCount:
		return bad("buffers", t.Buffers, fmt.Sprintf("between 1 and %d (0: the default)", maxStagingCount))
	case t.Workers < 0 || t.Workers > maxCopyWorkers:
		return bad("workers", t.Workers, fmt.Sprintf("between 1 and %d (0: the default)", maxCopyWorkers))
	case t.Piece != 0 && t.Piece < minCopyPiece:
		return bad("piece", t.Piece, fmt.Sprintf("at least %d bytes (0: the default)", minCopyPiece))
	case t.Burst > 0 && t.Burst < minCopyPiece:
		return bad("burst", t.Burst, fmt.Sprintf("at least %d bytes (0: the default; negative: never drain)", minCopyPiece))
	}
	return nil
}

// StagingTuning returns how the manager stages pageable copies now.
func (m *Manager) StagingTuning() StagingTuning {
	p := m.staging
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tuning
}

// SetStagingTuning changes how the manager stages pageable copies (zero fields: the defaults), for
// benchmarks that compare settings in one process. The pool's buffers are freed (those of the old size
// would not fit the new one; the next copy allocates again). It refuses, with NotReady, while a staged
// copy runs or a buffer is held, and with a CaptureError while a capture is in progress (freeing pinned
// memory is an unsafe call); a buffer the driver refuses to free is given up, its error returned, and the
// tuning applied all the same.
func (m *Manager) SetStagingTuning(t StagingTuning) error {
	const op = "cudacore.staging_tuning"
	if err := t.check(op); err != nil {
		return err
	}
	t = t.withDefaults()
	return m.reg.Steady(func() error {
		if m.reg.active.Load() > 0 {
			return CaptureError(cuda.ErrorStreamCaptureUnsupported, op,
				"the staging tuning frees pinned memory, which a capture in progress forbids: change it before or after the capture")
		}
		p := m.staging
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.copies > 0 || len(p.all) != len(p.free)+len(p.busy) {
			return cuda.NewError(op, cuda.ErrorNotReady, fmt.Sprintf(
				"%d staged copies are running (%d staging buffers held): change the tuning once they are done", p.copies, len(p.all)-len(p.free)-len(p.busy)))
		}
		var first error
		for _, b := range p.busy {
			if err := m.drv.EventSynchronize(m.ctx, b.ev); err != nil {
				first = cmp.Or(first, err)
				continue // possibly still in use: given up, not freed
			}
			p.free = append(p.free, b.buf)
			p.events = append(p.events, b.ev)
		}
		for _, b := range p.free {
			if err := m.drv.MemFreeHost(m.ctx, b); err != nil {
				first = cmp.Or(first, err)
			}
		}
		p.all, p.free, p.busy = nil, nil, nil
		p.tuning, p.ceiling = t, 0
		p.returned.Broadcast()
		return first
	})
}

// plan is how a staged copy of n bytes is cut: chunks of one staging buffer, pieces within them.
type plan struct {
	n, chunk, piece int
	perChunk        int // pieces of a full chunk
	chunks, pieces  int
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

func newPlan(n, chunk, piece int) plan {
	piece = max(1, min(piece, chunk))
	p := plan{n: n, chunk: chunk, piece: piece, perChunk: ceilDiv(chunk, piece)}
	if n <= 0 {
		return p
	}
	p.chunks = ceilDiv(n, chunk)
	last := n - (p.chunks-1)*chunk
	p.pieces = (p.chunks-1)*p.perChunk + ceilDiv(last, piece)
	return p
}

// chunkSpan returns the offset and length of chunk c in the copy.
func (p plan) chunkSpan(c int) (off, n int) {
	off = c * p.chunk
	return off, min(p.chunk, p.n-off)
}

// piecesOf returns the number of pieces of chunk c.
func (p plan) piecesOf(c int) int {
	_, n := p.chunkSpan(c)
	return ceilDiv(n, p.piece)
}

// pieceSpan returns the chunk of piece i, and its offset in that chunk and length.
func (p plan) pieceSpan(i int) (c, off, n int) {
	c = i / p.perChunk
	off = (i % p.perChunk) * p.piece
	_, cn := p.chunkSpan(c)
	return c, off, min(p.piece, cn-off)
}

// crew is the host side of one staged copy: the workers, and the state of each chunk.
type crew struct {
	plan   plan
	user   []byte // the caller's memory: the source (host to device) or the destination
	toBuf  bool   // host to device: pieces go from user to the staging buffers
	inline bool   // no workers: the caller copies a chunk when it is ready
	slots  []slot
	next   atomic.Int64 // the next piece to claim
	stop   chan struct{}
	halted bool
	wg     sync.WaitGroup
}

// slot is one chunk of a staged copy.
type slot struct {
	buf   []byte        // its staging buffer, once it has one; written by the caller before ready closes
	ev    cuda.Event    // device to host: the event after its DMA
	ready chan struct{} // closed by the caller: buf may be copied into (host to device) or out of
	left  atomic.Int32  // its pieces not yet copied
	done  chan struct{} // closed by whoever copies its last piece
}

// newCrew starts the workers of a copy between user and the staging buffers as p cuts it: workers
// goroutines (bounded by GOMAXPROCS and the number of pieces); with fewer than two, the caller copies.
func newCrew(p plan, user []byte, toBuf bool, workers int) *crew {
	w := &crew{plan: p, user: user, toBuf: toBuf, slots: make([]slot, p.chunks), stop: make(chan struct{})}
	for c := range w.slots {
		s := &w.slots[c]
		s.ready, s.done = make(chan struct{}), make(chan struct{})
		s.left.Store(int32(p.piecesOf(c)))
	}
	workers = min(workers, runtime.GOMAXPROCS(0), p.pieces)
	if workers < 2 {
		w.inline = true
		return w
	}
	w.wg.Add(workers)
	for range workers {
		go w.work()
	}
	return w
}

// work copies pieces in order until none is left or the crew is halted.
func (w *crew) work() {
	defer w.wg.Done()
	for {
		i := int(w.next.Add(1) - 1)
		if i >= w.plan.pieces {
			return
		}
		c, off, n := w.plan.pieceSpan(i)
		s := &w.slots[c]
		select {
		case <-s.ready:
		case <-w.stop:
			return
		}
		w.copyPiece(s, c, off, n)
		if s.left.Add(-1) == 0 {
			close(s.done)
		}
	}
}

// fillStaging is how the crew copies into a staging buffer that a DMA reads next: fillForDMA.
// BenchmarkGPUPipelineSplit swaps in Go's copy to measure what the non-temporal stores give.
var fillStaging = fillForDMA

// copyPiece copies n bytes at offset off of chunk c between the caller's memory and s.buf.
func (w *crew) copyPiece(s *slot, c, off, n int) {
	coff, _ := w.plan.chunkSpan(c)
	u := w.user[coff+off : coff+off+n]
	if w.toBuf {
		fillStaging(s.buf[off:off+n], u) // the copy engine reads it next
	} else {
		copy(u, s.buf[off:off+n])
	}
}

// ready hands chunk c, whose buffer is buf, to the host side: the crew copies it, or, inline, the
// caller does now.
func (w *crew) ready(c int, buf []byte) {
	s := &w.slots[c]
	s.buf = buf
	if w.inline {
		_, n := w.plan.chunkSpan(c)
		w.copyPiece(s, c, 0, n)
		s.left.Store(0)
		close(s.done)
		return
	}
	close(s.ready)
}

// isDone says whether chunk c's host side is done.
func (w *crew) isDone(c int) bool {
	select {
	case <-w.slots[c].done:
		return true
	default:
		return false
	}
}

// waitDone waits until chunk c's host side is done.
func (w *crew) waitDone(c int) { <-w.slots[c].done }

// help is what the caller does while it waits for chunk c's host side: it copies the next unclaimed piece
// itself, if that piece's chunk has its buffer, and otherwise waits for c. Either way it returns soon, for
// the caller to look at its pipeline again (a chunk may be done, a buffer back). A caller that copies
// keeps its thread busy instead of parking it, which, for a goroutine locked to its thread (a call from
// C), costs a wake-up per chunk; and it never claims a piece it cannot copy at once, since the buffers
// are the caller's to hand out.
func (w *crew) help(c int) {
	if w.inline || w.isDone(c) {
		return
	}
	for {
		i := w.next.Load()
		if int(i) >= w.plan.pieces {
			break
		}
		pc, off, n := w.plan.pieceSpan(int(i))
		s := &w.slots[pc]
		select {
		case <-s.ready:
		default:
			w.waitDone(c)
			return
		}
		if !w.next.CompareAndSwap(i, i+1) {
			continue // a worker claimed it: look again
		}
		w.copyPiece(s, pc, off, n)
		if s.left.Add(-1) == 0 {
			close(s.done)
		}
		return
	}
	w.waitDone(c)
}

// halt stops the workers and waits until none touches the caller's memory or a staging buffer any more.
func (w *crew) halt() {
	if w.halted {
		return
	}
	w.halted = true
	close(w.stop)
	w.wg.Wait()
}

// stagedHtoD is CopyHtoD of pageable memory through the staging buffers; the caller holds s.
func (m *Manager) stagedHtoD(dst cuda.DevicePtr, src []byte, s *Stream) error {
	t := m.staging.begin()
	defer m.staging.end()
	pl := newPlan(len(src), t.Chunk, t.Piece)
	w := newCrew(pl, src, true, t.Workers)
	head, assigned := 0, 0 // chunks [head, assigned) hold a buffer not yet enqueued
	stretch := 0           // bytes enqueued since the DMAs last drained
	var drain cuda.Event   // recorded after a burst's last DMA: nothing more is enqueued until it completes
	var spinning time.Time // when the caller began asking whether drain completed, with the next chunk ready
	defer func() {
		w.halt()
		for c := head; c < assigned; c++ {
			m.staging.recycle(w.slots[c].buf, 0) // nothing was enqueued to read it
		}
		if drain != 0 {
			m.staging.recycle(nil, drain) // recording it again later is allowed, complete or not
		}
	}()
	// drained says whether the burst enqueued last has run (true when none is pending); a failed query is
	// the error it returns.
	drained := func() (bool, error) {
		if drain == 0 {
			return true, nil
		}
		if err := m.drv.EventQuery(m.ctx, drain); err != nil {
			if cuda.ResultOf(err) == cuda.ErrorNotReady {
				return false, nil
			}
			return false, err
		}
		m.staging.recycle(nil, drain)
		drain, stretch, spinning = 0, 0, time.Time{}
		return true, nil
	}
	for head < pl.chunks {
		// Enqueue every filled chunk, in order: one DMA each (enqueueing a chunk in smaller pieces as they
		// are filled was measured slower: driver-facts.md, "Pageable copies").
		for head < assigned && w.isDone(head) {
			if ok, err := drained(); err != nil || !ok {
				if err != nil {
					return err
				}
				break // a burst is draining: enqueue the next chunk once it has run
			}
			buf := w.slots[head].buf
			off, n := pl.chunkSpan(head)
			head++
			if err := m.drv.MemcpyHtoDAsync(m.ctx, dst+cuda.DevicePtr(off), buf[:n], s.h); err != nil {
				m.staging.recycle(buf, 0) // nothing reads it
				return err
			}
			if err := m.staging.put(buf, s); err != nil {
				return err
			}
			if stretch += n; t.Burst > 0 && stretch >= t.Burst && head < pl.chunks {
				ev, err := m.staging.record(s)
				if err != nil {
					return err
				}
				drain = ev
			}
		}
		if head == pl.chunks {
			break
		}
		// Hand the next chunks the buffers the pool has free now, without waiting; inline, one at a time,
		// so that each chunk's DMA is enqueued as soon as the caller has filled it.
		for assigned < pl.chunks && assigned-head < t.Buffers {
			buf, err := m.staging.poll()
			if err != nil {
				return m.unstagedHtoD(err, head == assigned, pl, dst, src, assigned, s)
			}
			if buf == nil {
				break
			}
			w.ready(assigned, buf)
			assigned++
			if w.inline {
				break
			}
		}
		switch {
		case head < assigned && drain != 0 && w.isDone(head):
			// The next chunk is ready and waits for the burst to drain: ask again at once (the copy
			// engine idles from the moment the burst has run until the next DMA is enqueued), handing the
			// workers each buffer that comes back meanwhile; past spinFor, as the stream waits do (here:
			// the stream had other work queued before the copy), wait in the driver instead.
			if spinning.IsZero() {
				spinning = time.Now()
			} else if time.Since(spinning) > spinFor {
				if err := m.drv.EventSynchronize(m.ctx, drain); err != nil {
					return err
				}
			}
			runtime.Gosched()
		case head < assigned:
			w.help(head)
		default: // the copy holds no buffer: wait for the pool
			buf, err := m.staging.get()
			if err != nil {
				return m.unstagedHtoD(err, true, pl, dst, src, assigned, s)
			}
			w.ready(assigned, buf)
			assigned++
		}
	}
	return nil
}

// stagedDtoH is CopyDtoH into pageable memory through the staging buffers; it returns once the data is
// in dst. The caller holds s.
func (m *Manager) stagedDtoH(dst []byte, src cuda.DevicePtr, s *Stream) error {
	t := m.staging.begin()
	defer m.staging.end()
	pl := newPlan(len(dst), t.Chunk, t.Piece)
	w := newCrew(pl, dst, false, t.Workers)
	// Chunks [freed, landed) have landed in their buffers and are being copied out; [landed, issued) have
	// their DMA and event enqueued.
	freed, landed, issued := 0, 0, 0
	stretch := 0 // bytes issued since the DMAs last drained
	defer func() {
		w.halt()
		for c := freed; c < landed; c++ {
			m.staging.recycle(w.slots[c].buf, 0) // landed: nothing writes it any more
		}
		for c := landed; c < issued; c++ {
			m.staging.putRecorded(w.slots[c].buf, w.slots[c].ev) // busy until its event says it landed
		}
	}()
	// A burst issued: no more DMAs until those issued have landed (the engine's queue ran dry).
	paused := func() bool { return t.Burst > 0 && stretch >= t.Burst && landed < issued }
	issue := func(buf []byte) error {
		c := issued
		off, n := pl.chunkSpan(c)
		if landed == issued {
			stretch = 0
		}
		stretch += n
		if err := m.drv.MemcpyDtoHAsync(m.ctx, buf[:n], src+cuda.DevicePtr(off), s.h); err != nil {
			m.staging.recycle(buf, 0)
			return err
		}
		ev, err := m.staging.record(s)
		if err != nil {
			// The DMA into buf was enqueued but cannot be tracked: wait for the stream before reuse, as put.
			m.staging.untracked(buf, s)
			return err
		}
		w.slots[c].buf, w.slots[c].ev = buf, ev
		issued++
		return nil
	}
	for freed < pl.chunks {
		// The buffers of the chunks copied out take the next DMAs, or go back to the pool.
		for freed < landed && w.isDone(freed) {
			buf := w.slots[freed].buf
			freed++
			if issued == pl.chunks || paused() {
				m.staging.recycle(buf, 0)
			} else if err := issue(buf); err != nil {
				return err
			}
		}
		// More DMAs, into the buffers the pool has free now, without waiting.
		for issued < pl.chunks && issued-freed < t.Buffers && !paused() {
			buf, err := m.staging.poll()
			if err != nil {
				return m.unstagedDtoH(err, freed == issued, pl, dst, src, issued, s)
			}
			if buf == nil {
				break
			}
			if err := issue(buf); err != nil {
				return err
			}
		}
		switch {
		case landed < issued: // the oldest DMA: wait until it has landed, then copy it out
			sl := &w.slots[landed]
			if err := m.drv.EventSynchronize(m.ctx, sl.ev); err != nil {
				return err // busy until its event says so (the deferred putRecorded)
			}
			m.staging.recycle(nil, sl.ev)
			sl.ev = 0
			landed++
			w.ready(landed-1, sl.buf)
		case freed < landed:
			w.help(freed)
		case freed < pl.chunks: // the copy holds no buffer: wait for the pool
			buf, err := m.staging.get()
			if err != nil {
				return m.unstagedDtoH(err, true, pl, dst, src, issued, s)
			}
			if err := issue(buf); err != nil {
				return err
			}
		}
	}
	return nil
}

// unstagedHtoD is what a staged host-to-device copy does when the pool refuses it a buffer (err): when
// the pool has none and cannot allocate one (noStaging) and the copy holds none (idle), the chunks from
// next on go through the driver's own copy, in order after the DMAs enqueued so far; otherwise it fails
// with err. The driver stages pageable memory and returns once it has read it, but reads memory it knows
// as page-locked (another library's) when the stream gets there, so the stream is waited for: the call
// returns once src is read, as a staged copy does.
func (m *Manager) unstagedHtoD(err error, idle bool, pl plan, dst cuda.DevicePtr, src []byte, next int, s *Stream) error {
	var ns noStaging
	if !errors.As(err, &ns) {
		return err
	}
	if !idle {
		return ns.err
	}
	off, _ := pl.chunkSpan(next)
	if err := m.drv.MemcpyHtoDAsync(m.ctx, dst+cuda.DevicePtr(off), src[off:], s.h); err != nil {
		return err
	}
	return m.drv.StreamSynchronize(m.ctx, s.h)
}

// unstagedDtoH is unstagedHtoD device to host: the driver's pageable copy returns once the data is in
// dst, as the staged copy does. No worker touches dst[off:] (its chunks were never handed to the crew).
func (m *Manager) unstagedDtoH(err error, idle bool, pl plan, dst []byte, src cuda.DevicePtr, next int, s *Stream) error {
	var ns noStaging
	if !errors.As(err, &ns) {
		return err
	}
	if !idle {
		return ns.err
	}
	off, _ := pl.chunkSpan(next)
	return m.drv.MemcpyDtoHAsync(m.ctx, dst[off:], src+cuda.DevicePtr(off), s.h)
}
