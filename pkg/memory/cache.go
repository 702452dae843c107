package memory

import (
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// Defaults of CacheOptions.
const (
	DefaultMaxBlock  = 64 << 20 // blocks above this go straight to the resource below
	DefaultMaxCached = 1 << 30  // total bytes the cache may hold
)

// CacheOptions configure NewCache; zero fields take the defaults.
type CacheOptions struct {
	MaxBlock  uint64 // largest request served from size classes (default 64 MiB)
	MaxCached uint64 // most bytes held in the free lists at once (default 1 GiB)
	// Keep says whether blocks freed on stream s may be kept: a kept block is freed on s later (Release),
	// so s must stay valid until the cache hears of its destruction (ReleaseStream). A stream another
	// library owns (CuPy's, PyTorch's, cuda.core's) may be destroyed without a word, and handing its
	// handle to the driver then crashes the process: its blocks go straight back to the pool. nil keeps
	// blocks of every stream; the default streams are always kept.
	Keep func(s cuda.Stream) bool
	// Quiet, when set and true, makes Release free nothing: a capture in progress forbids the frees (a
	// stream-ordered free outside a capture is an unsafe call: the driver's 900 in GLOBAL mode, and in
	// THREAD_LOCAL mode on the capturing thread), which would invalidate it, and the block taken out of the
	// cache would be lost.
	Quiet func() bool
}

// Cache is the hot path in front of a stream-ordered Pool: a freed block of up to MaxBlock bytes is kept
// in a free list per (size class, stream) and handed back by the next Allocate of that class on the same
// stream, with no driver call. A stream-ordered free makes the block reusable by later work on its stream
// without waiting, so reuse on the same stream is safe; it is never reused on another stream, which could
// run ahead of the work still using it.
//
// Size classes (classOf): 256 B steps up to 1 KiB (256, 512, 768, 1024), then four classes per power of
// two (for 2^k < n <= 2^(k+1): 1.25, 1.5, 1.75 and 2 times 2^k). So above 1 KiB a block wastes less than
// 25% of the request, and below it less than 256 B; 64 MiB is reached with 68 classes. Requests of a class
// are allocated from below at the class size, which is what lets any request of the class reuse a block.
//
// The cache holds at most MaxCached bytes: a free that would take it over goes to the resource below.
// Blocks freed on CU_STREAM_PER_THREAD are never cached, since that handle names a different stream on
// every OS thread. Release (and Retry, on out of memory) frees every cached block on its stream; a stream
// must be emptied with ReleaseStream before it is destroyed.
//
// Concurrency: each stream has its own free lists behind its own mutex, held only for a slice push or
// pop; the stream table is copy-on-write behind an atomic pointer and the cached-bytes bound an atomic,
// so goroutines on different streams never wait for each other.
type Cache struct {
	inner     Resource
	maxBlock  uint64
	maxCached uint64
	nClasses  int
	keep      func(cuda.Stream) bool
	quiet     func() bool // CacheOptions.Quiet

	// streams is copy-on-write: readers load it with one atomic and scan it (programs use a handful of
	// streams, so a scan beats hashing); writers, rare, hold tabMu and publish a new slice.
	streams atomic.Pointer[[]*streamBins]
	tabMu   sync.Mutex
	// relMu is held for reading by Release from the detach of the free lists until their blocks are freed,
	// and for writing by ReleaseStream: once ReleaseStream returns, no block of its stream is still on its
	// way to the driver (a Release that had detached it would free it on the stream after its destruction).
	relMu  sync.RWMutex
	cached atomic.Uint64 // bytes in all free lists: the MaxCached bound
	misses atomic.Uint64
	hits   atomic.Uint64 // hits of entries detached by Release and ReleaseStream

	// Blocks allocated during a capture are graph memory: they must never enter the free lists, even
	// when freed after the capture ended. graphLive counts them so that the hot path pays one atomic
	// load, and the map is consulted only while some exist.
	graphMu   sync.Mutex
	graphPtrs map[cuda.DevicePtr]struct{}
	graphLive atomic.Int64

	// capturing counts streams marked by SetCapturing: while any is, Release must not reach the pool,
	// whose release synchronizes the context and would invalidate the capture.
	capturing atomic.Int64
}

type streamBins struct {
	s    cuda.Stream
	mu   sync.Mutex
	bins [][]cuda.DevicePtr // by class index
	n    int                // blocks held
	hits uint64             // under mu: one atomic fewer on the hot path
	dead bool               // detached from the table: pushes go to a fresh entry
	// capturing: the stream is being captured into a graph (SetCapturing). Its allocations and frees
	// then go to the driver, which records them as graph memory nodes; a cached block handed out or
	// taken back inside a capture would be baked into the graph and later aliased by another buffer.
	capturing bool
}

// NewCache wraps inner, which should be stream-ordered (a Pool): with a synchronous resource the cache is
// still correct but saves only the driver call.
func NewCache(inner Resource, opts CacheOptions) *Cache {
	if opts.MaxBlock == 0 {
		opts.MaxBlock = DefaultMaxBlock
	}
	if opts.MaxCached == 0 {
		opts.MaxCached = DefaultMaxCached
	}
	opts.MaxBlock = min(opts.MaxBlock, 1<<62) // keeps class arithmetic far from overflow
	idx, _ := classOf(opts.MaxBlock)
	return &Cache{inner: inner, maxBlock: opts.MaxBlock, maxCached: opts.MaxCached, nClasses: idx + 1, keep: opts.Keep, quiet: opts.Quiet}
}

// classOf returns the size class of n > 0: its index and its size.
func classOf(n uint64) (int, uint64) {
	if n <= 1024 {
		i := int((n+255)/256) - 1
		return i, uint64(i+1) * 256
	}
	k := bits.Len64(n-1) - 1 // 2^k < n <= 2^(k+1), k >= 10
	step := uint64(1) << (k - 2)
	sub := (n - 1 - 1<<k) >> (k - 2) // 0..3
	return 4 + (k-10)*4 + int(sub), 1<<k + (sub+1)*step
}

// blockSize is what an allocation of size takes from below.
func (c *Cache) blockSize(size uint64) uint64 {
	if size == 0 || size > c.maxBlock {
		return size
	}
	_, cs := classOf(size)
	return cs
}

func normStream(s cuda.Stream) cuda.Stream {
	if s == 0 {
		return cuda.StreamLegacy // the 0 handle and CU_STREAM_LEGACY are the same stream
	}
	return s
}

func (c *Cache) bins(s cuda.Stream, create bool) *streamBins {
	if t := c.streams.Load(); t != nil {
		for _, b := range *t {
			if b.s == s {
				return b
			}
		}
	}
	if !create {
		return nil
	}
	c.tabMu.Lock()
	defer c.tabMu.Unlock()
	var old []*streamBins
	if t := c.streams.Load(); t != nil {
		old = *t
	}
	for _, b := range old {
		if b.s == s {
			return b
		}
	}
	b := &streamBins{s: s, bins: make([][]cuda.DevicePtr, c.nClasses)}
	t := append(append(make([]*streamBins, 0, len(old)+1), old...), b)
	c.streams.Store(&t)
	return b
}

// detach removes s's free lists from the table (with all, every stream's not being captured) and
// returns them.
func (c *Cache) detach(s cuda.Stream, all bool) []*streamBins {
	c.tabMu.Lock()
	defer c.tabMu.Unlock()
	t := c.streams.Load()
	if t == nil {
		return nil
	}
	// While any stream captures, the legacy stream's blocks stay too: a free on the legacy stream waits
	// for every blocking stream, so the driver refuses it while one captures (906) and invalidates the
	// capture, and the block, taken out of the cache, would be lost for good.
	anyCapture := c.capturing.Load() > 0
	var keep, out []*streamBins
	for _, b := range *t {
		b.mu.Lock()
		capturing := b.capturing
		b.mu.Unlock()
		// A stream being captured keeps its entry, blocks and mark: freeing on it now would put free
		// nodes into the graph, and on another stream could break the capture.
		if all && !capturing && !(anyCapture && b.s == cuda.StreamLegacy) || !all && b.s == s {
			out = append(out, b)
		} else {
			keep = append(keep, b)
		}
	}
	c.streams.Store(&keep)
	return out
}

// Allocate serves size from the free list of its class on s if it holds a block, and otherwise allocates
// the class size from below. Requests above MaxBlock pass through unchanged.
func (c *Cache) Allocate(size uint64, s cuda.Stream) (cuda.DevicePtr, error) {
	if size == 0 {
		return 0, errZeroSize()
	}
	if size > c.maxBlock {
		return c.inner.Allocate(size, s)
	}
	idx, cs := classOf(size)
	if s = normStream(s); s != cuda.StreamPerThread {
		if b := c.bins(s, false); b != nil {
			b.mu.Lock()
			// A dead entry (detached by Release meanwhile) holds nothing.
			if b.capturing {
				b.mu.Unlock()
				return c.allocateCaptured(cs, s)
			}
			if l := b.bins; !b.dead && len(l[idx]) > 0 {
				l := l[idx]
				p := l[len(l)-1]
				b.bins[idx] = l[:len(l)-1]
				b.n--
				b.hits++
				b.mu.Unlock()
				c.cached.Add(-cs)
				return p, nil
			}
			b.mu.Unlock()
		}
	}
	c.misses.Add(1)
	return c.inner.Allocate(cs, s)
}

// Deallocate keeps p for reuse on s, or frees it below when it is too large, freed on the per-thread
// stream, or would take the cache over MaxCached.
func (c *Cache) Deallocate(p cuda.DevicePtr, size uint64, s cuda.Stream) error {
	if size == 0 {
		return errZeroSize()
	}
	if size > c.maxBlock {
		return c.inner.Deallocate(p, size, s)
	}
	idx, cs := classOf(size)
	if c.graphLive.Load() > 0 && c.forgetCaptured(p) {
		if err := c.inner.Deallocate(p, cs, s); err != nil {
			// Still graph memory: a retry must reach the driver again, never the free lists (from which
			// an address the driver does not hold would be handed to the next allocation).
			c.rememberCaptured(p)
			return err
		}
		return nil
	}
	if s = normStream(s); s == cuda.StreamPerThread || c.keep != nil && s != cuda.StreamLegacy && !c.keep(s) || !c.reserve(cs) {
		return c.inner.Deallocate(p, cs, s)
	}
	for {
		b := c.bins(s, true)
		b.mu.Lock()
		if b.capturing {
			b.mu.Unlock()
			c.cached.Add(-cs)
			return c.inner.Deallocate(p, cs, s)
		}
		if !b.dead {
			b.bins[idx] = append(b.bins[idx], p)
			b.n++
			b.mu.Unlock()
			return nil
		}
		b.mu.Unlock() // Release detached it meanwhile: look again, which makes a new entry
	}
}

func (c *Cache) allocateCaptured(cs uint64, s cuda.Stream) (cuda.DevicePtr, error) {
	c.misses.Add(1)
	p, err := c.inner.Allocate(cs, s)
	if err != nil {
		return 0, err
	}
	c.rememberCaptured(p)
	return p, nil
}

// rememberCaptured records p as allocated during a capture (graph memory): its free goes to the driver.
func (c *Cache) rememberCaptured(p cuda.DevicePtr) {
	c.graphMu.Lock()
	defer c.graphMu.Unlock()
	if c.graphPtrs == nil {
		c.graphPtrs = map[cuda.DevicePtr]struct{}{}
	}
	if _, ok := c.graphPtrs[p]; !ok {
		c.graphPtrs[p] = struct{}{}
		c.graphLive.Add(1)
	}
}

// forgetCaptured reports whether p was allocated during a capture, forgetting it.
func (c *Cache) forgetCaptured(p cuda.DevicePtr) bool {
	c.graphMu.Lock()
	defer c.graphMu.Unlock()
	if _, ok := c.graphPtrs[p]; ok {
		delete(c.graphPtrs, p)
		c.graphLive.Add(-1)
		return true
	}
	return false
}

// SetCapturing tells the cache that s is (on) or is no longer (off) being captured into a graph, so that
// while it is, allocations and frees on s reach the driver and become graph memory nodes, and blocks
// allocated then never enter the free lists. The owner of the capture (the stream package, through the
// facade) calls it around cuStreamBeginCapture / cuStreamEndCapture. Streams that join a capture through
// an event wait are not known to the cache: mark them too.
func (c *Cache) SetCapturing(s cuda.Stream, on bool) {
	b := c.bins(normStream(s), true)
	b.mu.Lock()
	if b.capturing != on {
		if on {
			c.capturing.Add(1)
		} else {
			c.capturing.Add(-1)
		}
	}
	b.capturing = on
	b.mu.Unlock()
}

// reserve counts cs bytes into the cache unless that would exceed MaxCached.
func (c *Cache) reserve(cs uint64) bool {
	for {
		cur := c.cached.Load()
		if cur+cs > c.maxCached || cur+cs < cur {
			return false
		}
		if c.cached.CompareAndSwap(cur, cur+cs) {
			return true
		}
	}
}

type cachedBlock struct {
	p  cuda.DevicePtr
	cs uint64
}

// take empties one detached stream's free lists for good, returning the blocks; the caller frees them.
func (c *Cache) take(b *streamBins, out []cachedBlock) []cachedBlock {
	b.mu.Lock()
	for idx, l := range b.bins {
		_, cs := classOfIndex(idx)
		for _, p := range l {
			out = append(out, cachedBlock{p, cs})
		}
	}
	b.bins, b.n, b.dead = nil, 0, true
	c.hits.Add(b.hits)
	b.mu.Unlock()
	return out
}

// classOfIndex is the size of class idx (the inverse of classOf).
func classOfIndex(idx int) (int, uint64) {
	if idx < 4 {
		return idx, uint64(idx+1) * 256
	}
	k := (idx-4)/4 + 10
	sub := uint64((idx - 4) % 4)
	return idx, 1<<k + (sub+1)*(1<<(k-2))
}

// free gives blocks back below on s. A stream destroyed meanwhile (a caller that skipped ReleaseStream)
// makes the stream-ordered free fail; the block is then freed on the legacy stream instead.
func (c *Cache) free(s cuda.Stream, blocks []cachedBlock) error {
	var first error
	for _, bl := range blocks {
		c.cached.Add(-bl.cs)
		err := c.inner.Deallocate(bl.p, bl.cs, s)
		if err != nil && s != cuda.StreamLegacy {
			err = c.inner.Deallocate(bl.p, bl.cs, cuda.StreamLegacy)
		}
		if err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Release frees every cached block below, each on the stream it was freed on, then releases what the
// resource below caches (a pool's reserve). While Quiet says a capture runs it frees nothing; without
// Quiet, blocks cached on a stream being captured, and while any stream captures those cached on the
// legacy stream, stay until the capture ends. It returns the first error and goes on past it.
func (c *Cache) Release() error {
	if c.quiet != nil && c.quiet() {
		return nil // the blocks stay cached until a release after the capture (CacheOptions.Quiet)
	}
	var first error
	var blocks []cachedBlock
	c.relMu.RLock()
	for _, b := range c.detach(0, true) {
		blocks = c.take(b, blocks[:0])
		if err := c.free(b.s, blocks); err != nil && first == nil {
			first = err
		}
	}
	c.relMu.RUnlock()
	if c.capturing.Load() > 0 {
		return first // the pool's release synchronizes, which a capture forbids; the free lists are enough
	}
	if err := Release(c.inner); err != nil && first == nil {
		first = err
	}
	return first
}

// ReleaseStream frees the blocks cached for s and forgets s. Call it before destroying s.
func (c *Cache) ReleaseStream(s cuda.Stream) error {
	s = normStream(s)
	var first error
	c.relMu.Lock() // a Release that detached s's blocks has freed them when this returns
	defer c.relMu.Unlock()
	for _, b := range c.detach(s, false) {
		if err := c.free(s, c.take(b, nil)); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Cached is the bytes in the free lists plus what the resource below holds unused.
func (c *Cache) Cached() uint64 { return c.cached.Load() + Cached(c.inner) }

// CacheStats are the cache's own counters.
type CacheStats struct {
	Hits, Misses uint64 // allocations served from the free lists / from below
	Cached       uint64 // bytes in the free lists
	Blocks       int    // blocks in the free lists
	Streams      int    // streams with free lists
}

// Stats returns the cache's counters.
func (c *Cache) Stats() CacheStats {
	st := CacheStats{Hits: c.hits.Load(), Misses: c.misses.Load(), Cached: c.cached.Load()}
	if t := c.streams.Load(); t != nil {
		for _, b := range *t {
			b.mu.Lock()
			st.Blocks += b.n
			st.Hits += b.hits
			b.mu.Unlock()
			st.Streams++
		}
	}
	return st
}

func (c *Cache) Unwrap() Resource { return c.inner }

// MaxBlock is the largest request the cache serves from its size classes.
func (c *Cache) MaxBlock() uint64 { return c.maxBlock }
