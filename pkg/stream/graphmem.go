package stream

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// Graph memory and the memory a graph uses.
//
// An allocation made on a capturing stream is an allocation node of the graph (graph memory), and the
// driver gives it a lifetime of its own (docs/contributing/driver-facts.md, "Graph memory"):
//   - until the graph's first launch it is no allocation at all: freeing it fails, and if the capture is
//     aborted or the graph destroyed first, there is nothing to free;
//   - each launch allocates it anew, and a launch while the last launch's allocation is still live fails;
//   - once launched it is an ordinary allocation, freed like any other, also after its graph is gone.
//
// The caller's accounting (the allocator's in-use bytes, the tracker, the memory limit) counted the
// allocation when it was made; graphMemory keeps the two in step:
//   - pending (never launched): a free takes it off the books with no driver call, and the allocation
//     becomes an orphan; if the graph goes first (or the capture is aborted) it is taken off the books
//     and the pointer is void: its owner's later free is a no-op, and TakeVoided lists it so the Python
//     layer can mark its Buffer closed (the address may be handed out again by a later capture);
//   - live (launched, owner still holds it): a second launch is refused with a clear error rather than
//     the driver's bare 1; the owner's free is a real free, after which the allocation is an orphan;
//   - orphan (the owner freed it): every later launch's allocation has no owner, so it is freed on the
//     launch stream right after the launch.
//
// A graph also uses memory it did not allocate: captured copies and kernel arguments name device
// pointers. A free of memory a live graph uses is deferred until that graph is destroyed (the graph keeps
// the memory alive), so that a later launch cannot write into memory handed to someone else.
type graphMemory struct {
	// active counts allocs, void pointers and graphs with uses: when zero, frees skip all of this.
	active atomic.Int32
	// proper counts allocs and void pointers alone; version changes with every change of the books.
	proper  atomic.Int32
	version atomic.Uint64

	mu     sync.Mutex
	allocs map[cuda.DevicePtr]*graphAlloc
	void   map[cuda.DevicePtr]voidEntry // void pointers whose owner has not let go yet
	voided []Voided                     // void pointers not yet reported by TakeVoided
	users  map[*Graph]struct{}          // live graphs that use memory they did not allocate
	// pending counts the allocs in state gmPending (see checkPendingUse and pendingTotal).
	pending int
	// Owner tokens (see Token): the token of the current owner of each address allocated during a capture,
	// and the tokens of owners whose memory went void or whose address was handed out again since.
	tokens     map[cuda.DevicePtr]uint64
	stale      map[uint64]cuda.DevicePtr
	staleOrder []uint64 // stale's tokens, oldest first (some may be gone already)
	lastToken  uint64
}

// voidEntry is a void pointer's size and the token its owner held when it went void (0: none).
type voidEntry struct {
	size, token uint64
}

// Voided is a pointer made void, with the owner token that went stale with it (0: its owner had none):
// the Python layer marks closed the Buffer of that owner only, not a newer owner of the address.
type Voided struct {
	Ptr   cuda.DevicePtr
	Token uint64
}

type graphAllocState uint8

const (
	gmPending graphAllocState = iota // no launch yet
	gmLive                           // launched, and its owner has not freed it
	gmOrphan                         // its owner freed it: each launch's allocation is freed after the launch
)

type graphAlloc struct {
	g     *Graph
	size  uint64
	state graphAllocState
}

// span is a device address range [lo, hi) that a captured operation uses.
type span struct{ lo, hi cuda.DevicePtr }

func (gm *graphMemory) count() {
	gm.active.Store(int32(len(gm.allocs) + len(gm.void) + len(gm.voided) + len(gm.users)))
	gm.proper.Store(int32(len(gm.allocs) + len(gm.void) + len(gm.voided)))
	gm.version.Add(1)
}

// GraphMemoryProper says whether graph memory (allocations made during captures, and void pointers) is on
// the books, as distinct from memory that live graphs merely use.
func (m *Manager) GraphMemoryProper() bool { return m.gm.proper.Load() != 0 }

// GraphUses returns the ranges of memory the device's live graphs use ([lo[i], hi[i]), sorted and merged),
// appended to lo and hi, and the version of the books they were read at: the version changes whenever
// the books do, so a caller that kept an earlier version knows when to read them again.
func (m *Manager) GraphUses(lo, hi []uint64) ([]uint64, []uint64, uint64) {
	gm := &m.gm
	gm.mu.Lock()
	defer gm.mu.Unlock()
	var all []span
	for g := range gm.users {
		all = append(all, g.uses...)
	}
	for _, s := range mergeSpans(all) {
		lo, hi = append(lo, uint64(s.lo)), append(hi, uint64(s.hi))
	}
	return lo, hi, gm.version.Load()
}

// GraphUsesVersion is the version GraphUses would report now: one atomic load.
func (m *Manager) GraphUsesVersion() uint64 { return m.gm.version.Load() }

// noteUse records that the capture on s uses [p, p+n) (n may be 1 for a pointer whose extent is unknown).
func (m *Manager) noteUse(s *Stream, p cuda.DevicePtr, n uint64) {
	if s == nil || n == 0 || m.reg.active.Load() == 0 {
		return
	}
	m.reg.mu.Lock()
	defer m.reg.mu.Unlock()
	if c := s.cap; c != nil {
		c.uses = append(c.uses, span{p, p + cuda.DevicePtr(n)})
	}
}

// NoteUses records that the work about to be captured on stream h uses the device addresses ptrs (a
// kernel's pointer-sized arguments: an integer that is not a pointer only keeps nothing alive for
// longer). Nothing happens unless h captures.
func (m *Manager) NoteUses(h cuda.Stream, ptrs []cuda.DevicePtr) {
	if len(ptrs) == 0 || m.reg.active.Load() == 0 {
		return
	}
	m.reg.mu.Lock()
	defer m.reg.mu.Unlock()
	for c := range m.reg.caps {
		if c.member(m, h) != nil {
			for _, p := range ptrs {
				if p != 0 {
					c.uses = append(c.uses, span{p, p + 1})
				}
			}
			return
		}
	}
}

// takeUses adds other's uses to g's, once g's executable graph took other's parameters (Update): its
// launches name other's memory from then on, and its graph still names its own. Caller holds g.mu and
// other.mu.
func (m *Manager) takeUses(g, other *Graph) {
	if len(other.uses) == 0 {
		return
	}
	gm := &m.gm
	gm.mu.Lock() // FreeGraphAware reads g.uses under gm.mu alone
	defer gm.mu.Unlock()
	g.uses = mergeSpans(append(slices.Clone(g.uses), other.uses...))
	if gm.users == nil {
		gm.users = map[*Graph]struct{}{}
	}
	gm.users[g] = struct{}{}
	gm.count()
}

// NoteFree records that graph memory p of h's capture was freed inside the capture (a free node): the
// graph then holds no allocation of p beyond its launches.
func (m *Manager) NoteFree(h cuda.Stream, p cuda.DevicePtr) {
	if m.reg.active.Load() == 0 {
		return
	}
	m.reg.mu.Lock()
	defer m.reg.mu.Unlock()
	for c := range m.reg.caps {
		if c.member(m, h) != nil {
			delete(c.ptrs, p)
			m.gm.mu.Lock()
			delete(m.gm.tokens, p) // freed in its capture: no void can reach it any more
			m.gm.mu.Unlock()
			return
		}
	}
}

// adopt hands the capture's graph memory and uses to g, its graph.
func (m *Manager) adopt(g *Graph, ptrs map[cuda.DevicePtr]uint64, uses []span) {
	if len(ptrs) == 0 && len(uses) == 0 {
		return
	}
	gm := &m.gm
	gm.mu.Lock()
	defer gm.mu.Unlock()
	if len(ptrs) > 0 {
		if gm.allocs == nil {
			gm.allocs = map[cuda.DevicePtr]*graphAlloc{}
		}
		for p, size := range ptrs {
			if old := gm.allocs[p]; old != nil && old.state == gmPending {
				m.pendingAdd(-1) // replaced: counted once below
			}
			gm.allocs[p] = &graphAlloc{g: g, size: size}
			g.allocPtrs = append(g.allocPtrs, p)
		}
		m.pendingAdd(len(ptrs))
	}
	if len(uses) > 0 {
		g.uses = mergeSpans(uses)
		if gm.users == nil {
			gm.users = map[*Graph]struct{}{}
		}
		gm.users[g] = struct{}{}
	}
	gm.count()
}

// voidLocked takes pending graph memory p off the books and makes it void. Caller holds gm.mu.
func (m *Manager) voidLocked(p cuda.DevicePtr, size uint64) {
	gm := &m.gm
	if st := m.memory(); st != nil {
		_ = st.Forget(p, size) // an unknown p was never on the books
	}
	if gm.void == nil {
		gm.void = map[cuda.DevicePtr]voidEntry{}
	}
	t := gm.tokens[p]
	gm.void[p] = voidEntry{size, t}
	gm.voided = append(gm.voided, Voided{p, t})
	m.staleLocked(p)
	gm.count()
}

// Owner tokens. A void address is only void until the driver hands it out again, and then a free of it
// names the new owner's memory: by address alone, the late free of a stale owner (a Buffer of an aborted
// capture that the Python layer has not yet marked closed, on another thread say) would free the new
// owner's memory. So each allocation made during a capture gets a token (Token), which its owner passes
// back with its free (the GraphFree door, process.Device.FreeOwned): a token whose memory went void, or
// whose address was handed out again, is stale, and its free frees nothing (TokenStale). A live token is
// dropped once its owner's free has been made (DropToken); a stale one once its owner asks, or when the
// Python layer reports that owner closed (ForgetVoid), or, past maxStaleTokens, oldest first. Each is
// dropped alone: an address may have several stale owners at once (a free that waits for the captures
// to end, and a later owner of the same address voided meanwhile), and each one's late free must find its
// own token stale.

// tokenLocked gives the owner of p, just handed out to a capture, a new token (see reissuedLocked for the
// address's earlier owners). Caller holds gm.mu.
func (m *Manager) tokenLocked(p cuda.DevicePtr) {
	gm := &m.gm
	m.reissuedLocked(p)
	if gm.tokens == nil {
		gm.tokens = map[cuda.DevicePtr]uint64{}
	}
	gm.lastToken++
	gm.tokens[p] = gm.lastToken
}

// staleLocked makes the token of p's owner, if any, stale. Caller holds gm.mu.
func (m *Manager) staleLocked(p cuda.DevicePtr) {
	gm := &m.gm
	t, ok := gm.tokens[p]
	if !ok {
		return
	}
	delete(gm.tokens, p)
	if gm.stale == nil {
		gm.stale = map[uint64]cuda.DevicePtr{}
	}
	gm.stale[t] = p
	gm.staleOrder = append(gm.staleOrder, t)
	// A stale owner that never frees (a Buffer the Python layer marked closed itself, without a
	// GraphForgetVoid) never asks: past the bound, forget the oldest.
	for len(gm.stale) > maxStaleTokens {
		delete(gm.stale, gm.staleOrder[0])
		gm.staleOrder = gm.staleOrder[1:]
	}
	if len(gm.staleOrder) > 2*maxStaleTokens { // tokens asked for meanwhile: compact the order
		gm.staleOrder = slices.DeleteFunc(gm.staleOrder, func(u uint64) bool { _, ok := gm.stale[u]; return !ok })
	}
}

// maxStaleTokens bounds the stale owner tokens remembered (see staleLocked).
const maxStaleTokens = 1 << 14

// DropToken forgets t, the live token of p, once its owner's free was made (or handed to the rules of
// graph memory, which no later void can reach).
func (m *Manager) DropToken(p cuda.DevicePtr, t uint64) {
	gm := &m.gm
	gm.mu.Lock()
	if gm.tokens[p] == t {
		delete(gm.tokens, p)
	}
	gm.mu.Unlock()
}

// Token returns the owner token of p, allocated during a capture, or 0: for memory allocated otherwise,
// and for memory of a capture that went void before the owner asked (a stale token found by address
// could be an earlier owner's: the address may have been handed out again, to the asking owner itself).
// The owner passes it back with its free (TokenStale).
func (m *Manager) Token(p cuda.DevicePtr) uint64 {
	gm := &m.gm
	gm.mu.Lock()
	defer gm.mu.Unlock()
	return gm.tokens[p]
}

// TokenStale says whether the owner of token t may not free p: the token is stale (the memory went void,
// so the driver never allocated it, or the address was handed out again since). It then forgets the
// token, and the void entry of p if it is this owner's. A live token stays: the owner's free may wait
// (for the captures to end) and ask again when it runs.
func (m *Manager) TokenStale(p cuda.DevicePtr, t uint64) bool {
	gm := &m.gm
	gm.mu.Lock()
	defer gm.mu.Unlock()
	q, ok := gm.stale[t]
	if !ok || q != p {
		return false
	}
	delete(gm.stale, t)
	if v, void := gm.void[p]; void && v.token == t {
		m.unvoidLocked(p) // its own void entry: the address was not handed out again
	}
	return true
}

// unvoidLocked forgets void pointer p everywhere: its owner let go, or the driver handed p out again (a
// stale entry must neither swallow the new owner's free nor make the Python layer close its Buffer).
// Caller holds gm.mu.
func (m *Manager) unvoidLocked(p cuda.DevicePtr) {
	gm := &m.gm
	delete(gm.void, p)
	gm.voided = slices.DeleteFunc(gm.voided, func(v Voided) bool { return v.Ptr == p })
	gm.count()
}

// discard voids the graph memory of a capture that made no graph (aborted or invalidated).
func (m *Manager) discard(ptrs map[cuda.DevicePtr]uint64) {
	if len(ptrs) == 0 {
		return
	}
	m.gm.mu.Lock()
	defer m.gm.mu.Unlock()
	for p, size := range ptrs {
		m.voidLocked(p, size)
	}
}

// Reissued is called whenever the driver hands out p, to a capture or as ordinary memory (the real
// driver may give the address of discarded graph memory to a pool block): a void p is forgotten, so that
// the new owner's free is a real one, not the old owner's no-op. (The Python layer marks void Buffers
// closed first, so their owners free nothing.)
func (m *Manager) Reissued(p cuda.DevicePtr) {
	gm := &m.gm
	if gm.active.Load() == 0 {
		return
	}
	gm.mu.Lock()
	defer gm.mu.Unlock()
	m.reissuedLocked(p)
}

// reissuedLocked is Reissued with gm.mu held: a void p is forgotten, and an earlier owner of the address
// that still has a token is stale now.
func (m *Manager) reissuedLocked(p cuda.DevicePtr) {
	if _, ok := m.gm.void[p]; ok {
		m.unvoidLocked(p)
	}
	m.staleLocked(p)
}

// ForgetVoid is told that the owner of p with token t (0: an owner without one) let go for good: the
// Python layer marked its Buffer closed, or its free found the capture invalidated, which voided the
// memory. It forgets that token, and says whether p was void on that owner's account, forgetting that
// too. The stale tokens of p's other owners stay: a free of theirs may still come.
func (m *Manager) ForgetVoid(p cuda.DevicePtr, t uint64) bool {
	gm := &m.gm
	gm.mu.Lock()
	defer gm.mu.Unlock()
	return m.forgetVoidLocked(p, t)
}

// ForgetVoidAt is ForgetVoid for the free by address (no token) of memory that was graph memory of its
// capture when the free was made, and that the capture's end has just voided: whatever void entry p has
// is that owner's.
func (m *Manager) ForgetVoidAt(p cuda.DevicePtr) bool {
	gm := &m.gm
	gm.mu.Lock()
	defer gm.mu.Unlock()
	v, ok := gm.void[p]
	return ok && m.forgetVoidLocked(p, v.token)
}

func (m *Manager) forgetVoidLocked(p cuda.DevicePtr, t uint64) bool {
	gm := &m.gm
	if q, ok := gm.stale[t]; ok && q == p {
		delete(gm.stale, t)
	}
	if v, ok := gm.void[p]; !ok || v.token != t {
		return false
	}
	m.unvoidLocked(p)
	return true
}

// TakeVoided returns the pointers made void since the last call (see graphMemory). They stay void until
// their owner's free (a no-op) or until the driver hands the address out again: the Python layer marks
// the Buffers it knows of closed, but an owner it does not know of (a collected Buffer, a framework's
// allocation) may still free one, and that free must not take the bytes off the books a second time.
func (m *Manager) TakeVoided() []Voided {
	gm := &m.gm
	if gm.active.Load() == 0 {
		return nil
	}
	gm.mu.Lock()
	defer gm.mu.Unlock()
	out := gm.voided
	gm.voided = nil
	gm.count()
	return out
}

// GraphMemoryInUse says whether any graph memory or memory a live graph uses is on the books: while not,
// FreeGraphAware has nothing to do, and a caller can free without building its callbacks.
func (m *Manager) GraphMemoryInUse() bool { return m.gm.active.Load() != 0 }

// Free is the graph-aware part of freeing p (size bytes): it returns handled=false when p is ordinary
// memory that no live graph uses, and the caller frees it itself. Otherwise:
//   - void graph memory: nothing to free;
//   - graph memory no launch has made real: taken off the books, and freed after every later launch;
//   - launched graph memory: freed now with free, and after every later launch;
//   - memory a live graph uses: later is called once no live graph uses it (after their destruction).
func (m *Manager) FreeGraphAware(p cuda.DevicePtr, size uint64, free func() error, later func()) (handled bool, err error) {
	gm := &m.gm
	if gm.active.Load() == 0 {
		return false, nil
	}
	gm.mu.Lock()
	if v, ok := gm.void[p]; ok && v.size == size {
		m.unvoidLocked(p)
		gm.mu.Unlock()
		return true, nil
	}
	if a := gm.allocs[p]; a != nil && a.size == size {
		switch a.state {
		case gmPending:
			if st := m.memory(); st != nil {
				_ = st.Forget(p, size)
			}
			a.state = gmOrphan
			m.pendingAdd(-1)
			gm.mu.Unlock()
			return true, nil
		case gmLive:
			// Another live graph may name it (a copy captured after the launch): the free waits for that
			// graph, as for ordinary memory. The allocating graph's own uses do not hold it.
			if holder := m.userLocked(p, size, a.g); holder != nil {
				gm.mu.Unlock()
				holder.afterDestroy(later)
				return true, nil
			}
			gm.mu.Unlock()
			if err := free(); err != nil {
				return true, err
			}
			gm.mu.Lock()
			if gm.allocs[p] == a {
				a.state = gmOrphan
			}
			gm.mu.Unlock()
			return true, nil
		}
		// An orphan has no owner: a free of it is a second free, which the allocator reports.
	}
	holder := m.userLocked(p, size, nil)
	gm.mu.Unlock()
	if holder == nil {
		return false, nil
	}
	holder.afterDestroy(later)
	return true, nil
}

// userLocked returns a live graph other than except that uses any byte of [p, p+size), or nil. Caller
// holds gm.mu.
func (m *Manager) userLocked(p cuda.DevicePtr, size uint64, except *Graph) *Graph {
	for g := range m.gm.users {
		if g != except && g.usesRange(p, size) {
			return g
		}
	}
	return nil
}

// checkLaunchInto refuses a launch of g on s while s captures, leaving the capture going. The driver
// refuses every graph launch on a capturing stream, in every capture mode, with 900, and invalidates the
// capture (measured on the H100, driver 580: scripts/gpu/graph_launch_capture.py). Refused here, the
// capture is kept and the error says why. Another thread may have begun the capture since the caller
// looked, so it is checked here, under g.mu, before the driver sees the launch: a capture begins in the
// registry before it begins at the driver, and ends at the driver before it leaves the registry, so a
// stream the registry does not list is not capturing. Caller holds g.mu.
func (m *Manager) checkLaunchInto(op string, g *Graph, s *Stream) error {
	c := s.capturing()
	if c == nil {
		return nil
	}
	return CaptureError(cuda.ErrorStreamCaptureUnsupported, op, fmt.Sprintf(
		"%s cannot be launched on a stream that captures, and %s: the driver refuses a graph launch there "+
			"in every capture mode (and would end the capture); the capture goes on. Launch the graph before or "+
			"after the capture, or on a stream that does not capture", g, c.describe()))
}

// checkLaunch refuses a launch of g while an allocation of its last launch is still held by its owner:
// the driver would fail it (error 1) without saying why. Caller holds g.mu.
func (m *Manager) checkLaunch(op string, g *Graph) error {
	if len(g.allocPtrs) == 0 {
		return nil
	}
	gm := &m.gm
	gm.mu.Lock()
	defer gm.mu.Unlock()
	for _, p := range g.allocPtrs {
		if a := gm.allocs[p]; a != nil && a.g == g && a.state == gmLive {
			return cuda.NewError("cudacore."+op, cuda.ErrorIllegalState, fmt.Sprintf(
				"%s allocates %d bytes at %#x, and the Buffer of its last launch's allocation is still open: "+
					"close that Buffer (or free the memory in the graph) before launching it again", g, a.size, uint64(p)))
		}
	}
	return nil
}

// launched updates g's allocations after a launch on s: the first launch makes them real, and those
// whose owner freed them are freed on s after the launch. Caller holds g.mu.
func (m *Manager) launched(g *Graph, s *Stream) {
	if len(g.allocPtrs) == 0 {
		return
	}
	gm := &m.gm
	gm.mu.Lock()
	var orphans []cuda.DevicePtr
	for _, p := range g.allocPtrs {
		a := gm.allocs[p]
		if a == nil || a.g != g {
			continue
		}
		switch a.state {
		case gmPending:
			a.state = gmLive
			m.pendingAdd(-1)
		case gmOrphan:
			orphans = append(orphans, p)
		}
	}
	gm.mu.Unlock()
	for _, p := range orphans {
		// Ordered after the launch on its stream. A failure is left to the next launch, which the driver
		// then refuses as if the memory were still live: nothing is freed twice. The free waits for the
		// captures to end, still ordered after the launch (on the legacy stream if s is gone by then), where
		// it is an unsafe call that a capture forbids (900, which would invalidate that capture), and where
		// a capture begun on s since the launch (by another thread) would take it into its own graph, to
		// free only if that graph were launched. The deferred free runs as the last capture ends, before
		// another can begin. The stream's lifetime bracket comes before the registry's mutex
		// (RunOrDeferUnsafeOn), as on the allocation path: the other order could deadlock against it
		// behind a stream's destroy.
		h := m.UseForFree(s.h)
		_, _ = m.reg.RunOrDeferUnsafeOn(m, h, func() error { return m.drv.MemFreeAsync(m.ctx, p, h) }, func() {
			later := Later(s.h)
			h := m.UseForFree(later)
			defer m.Done(later)
			_ = m.drv.MemFreeAsync(m.ctx, p, h)
		})
		m.Done(s.h)
	}
}

// graphGone forgets g's allocations and uses once it is destroyed: pending ones become void (taken off
// the books), launched ones are ordinary allocations from now on.
func (m *Manager) graphGone(g *Graph) {
	if len(g.allocPtrs) == 0 && len(g.uses) == 0 {
		return
	}
	gm := &m.gm
	gm.mu.Lock()
	defer gm.mu.Unlock()
	for _, p := range g.allocPtrs {
		a := gm.allocs[p]
		if a == nil || a.g != g {
			continue
		}
		delete(gm.allocs, p)
		if a.state == gmPending {
			m.pendingAdd(-1)
			m.voidLocked(p, a.size)
		}
	}
	delete(gm.users, g)
	gm.count()
}

// mergeSpans sorts spans and merges the overlapping ones.
func mergeSpans(in []span) []span {
	s := slices.Clone(in)
	slices.SortFunc(s, func(a, b span) int {
		switch {
		case a.lo < b.lo:
			return -1
		case a.lo > b.lo:
			return 1
		}
		return 0
	})
	out := s[:0]
	for _, x := range s {
		if n := len(out); n > 0 && x.lo <= out[n-1].hi {
			out[n-1].hi = max(out[n-1].hi, x.hi)
			continue
		}
		out = append(out, x)
	}
	return out
}

// usesRange says whether g uses any byte of [p, p+size).
func (g *Graph) usesRange(p cuda.DevicePtr, size uint64) bool {
	hi := p + cuda.DevicePtr(size)
	i, _ := slices.BinarySearchFunc(g.uses, p, func(s span, t cuda.DevicePtr) int {
		if s.hi <= t {
			return -1
		}
		return 1
	})
	return i < len(g.uses) && g.uses[i].lo < hi
}

// afterDestroy runs fn once g is destroyed: now, if it is.
func (g *Graph) afterDestroy(fn func()) {
	g.mu.Lock()
	if !g.gone {
		g.deferred = append(g.deferred, fn)
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	fn()
}

// ---- use of graph memory that no launch has made real --------------------------------------------------

// pendingTotal counts, across the managers of the process, the graph memory allocations that no launch has
// made real (gmPending); pendingHook, when set, is called after each change (under the changing manager's
// gm.mu) so that the direct path of the hot calls, which never enters Go, can leave such memory to the
// checks here.
var (
	pendingTotal atomic.Int32
	pendingHook  atomic.Pointer[func()]
)

// SetPendingHook sets the function called each time the process-wide count of graph memory allocations
// that no launch has made real changes (nil: none), and calls it once at once. It reads the count with
// PendingGraphMemory: changes on two devices' managers may call it in either order, so a count passed
// along could be stale, while one read under the hook's own lock is not.
func SetPendingHook(fn func()) {
	if fn == nil {
		pendingHook.Store(nil)
		return
	}
	pendingHook.Store(&fn)
	fn()
}

// PendingGraphMemory returns the process-wide count of graph memory allocations that no launch has made
// real.
func PendingGraphMemory() int { return int(pendingTotal.Load()) }

// pendingAdd changes the count of pending allocations by d. Caller holds gm.mu.
func (m *Manager) pendingAdd(d int) {
	if d == 0 {
		return
	}
	m.gm.pending += d
	pendingTotal.Add(int32(d))
	if h := pendingHook.Load(); h != nil {
		(*h)()
	}
}

// pendingUseFix is the end of the error for a use of graph memory that no launch has made real.
const pendingUseFix = "graph memory of a graph that was never launched has no memory behind it yet: " +
	"launch the graph first, or use the Buffer inside its capture"

// checkPendingUse refuses op on stream s (nil: a synchronous call) naming the device ranges given when
// any byte of them is graph memory that no launch has made real, unless the use is inside the capture
// that allocated it (on its capturing stream, or on a stream joined to a capture): the driver has no
// memory behind such an address, and a copy or kernel naming it fails or, in a graph, brings the process
// down at instantiation. One atomic load each when no graph memory and no capture exists.
func (m *Manager) checkPendingUse(op string, s *Stream, ranges ...span) error {
	var h cuda.Stream
	if s != nil {
		h = s.h
	}
	return m.checkPendingUseOn(op, h, s != nil, ranges)
}

// CheckGraphMemoryUse is checkPendingUse for work enqueued on stream handle h (a kernel launch) that names
// the device addresses ptrs (its pointer-sized arguments; an integer that only looks like a pointer into
// such memory is refused too, as the driver could not tell either).
func (m *Manager) CheckGraphMemoryUse(op string, h cuda.Stream, ptrs []cuda.DevicePtr) error {
	if !m.PendingUsePossible() {
		return nil
	}
	ranges := make([]span, 0, len(ptrs))
	for _, p := range ptrs {
		if p != 0 {
			ranges = append(ranges, span{p, p + 1})
		}
	}
	return m.checkPendingUseOn(op, h, true, ranges)
}

// PendingUsePossible says whether CheckGraphMemoryUse can refuse anything now: false (one or two atomic
// loads) while the device has no graph memory and nothing captures.
func (m *Manager) PendingUsePossible() bool {
	return m.gm.active.Load() != 0 || m.reg.active.Load() != 0
}

func overlaps(p cuda.DevicePtr, size uint64, r span) bool {
	return r.lo < p+cuda.DevicePtr(size) && p < r.hi
}

func (m *Manager) checkPendingUseOn(op string, h cuda.Stream, onStream bool, ranges []span) error {
	if len(ranges) == 0 || (m.gm.active.Load() == 0 && m.reg.active.Load() == 0) {
		return nil
	}
	if err := m.checkPendingEnded(op, ranges); err != nil {
		return err
	}
	if m.reg.active.Load() == 0 {
		return nil
	}
	return m.checkPendingCapture(op, h, onStream, ranges)
}

// checkPendingEnded refuses ranges that hold graph memory of an ended capture's graph never launched.
func (m *Manager) checkPendingEnded(op string, ranges []span) error {
	if m.gm.active.Load() != 0 {
		gm := &m.gm
		gm.mu.Lock()
		if gm.pending > 0 {
			for p, a := range gm.allocs {
				if a.state != gmPending {
					continue
				}
				for _, r := range ranges {
					if overlaps(p, a.size, r) {
						g := a.g
						size := a.size
						gm.mu.Unlock()
						return cuda.NewError("cudacore."+op, cuda.ErrorIllegalState, fmt.Sprintf(
							"%s names the %d bytes at %#x that %s allocates (graph memory), and that graph was never launched; %s",
							op, size, uint64(p), g, pendingUseFix))
					}
				}
			}
		}
		gm.mu.Unlock()
	}
	return nil
}

// checkPendingCapture refuses ranges that hold graph memory of a capture in progress, named outside it.
func (m *Manager) checkPendingCapture(op string, h cuda.Stream, onStream bool, ranges []span) error {
	m.reg.mu.Lock()
	var owner *capture
	var at cuda.DevicePtr
	var atSize uint64
	for c := range m.reg.caps {
		if c.stream.m != m || len(c.ptrs) == 0 {
			continue
		}
		for p, size := range c.ptrs {
			for _, r := range ranges {
				if overlaps(p, size, r) {
					if onStream && c.member(m, h) != nil {
						continue // inside its own capture: the allocation node precedes the use
					}
					owner, at, atSize = c, p, size
				}
			}
		}
	}
	var desc string
	if owner != nil {
		desc = owner.describe()
	}
	m.reg.mu.Unlock()
	if owner == nil {
		return nil
	}
	return cuda.NewError("cudacore."+op, cuda.ErrorIllegalState, fmt.Sprintf(
		"%s names the %d bytes at %#x allocated during the capture in progress (%s), outside that capture; %s",
		op, atSize, uint64(at), desc, pendingUseFix))
}

// CheckForeignUse refuses op, work enqueued on a stream of another device (the far side of a peer copy)
// that names [p, p+n) of m's device, when any byte of it is graph memory of m's device that no launch has
// made real: memory of an ended capture's graph never launched, or of a capture in progress (a stream of
// another device is not inside it).
func (m *Manager) CheckForeignUse(op string, p cuda.DevicePtr, n uint64) error {
	return m.checkPendingUseOn(op, 0, false, []span{{p, p + cuda.DevicePtr(max(n, 1))}})
}

// CheckGraphMemoryExport refuses op, an export of [p, p+size) to another library (DLPack), when any byte
// of it is graph memory of a graph that no launch has made real. Memory of a capture still in progress
// may be exported: the consumer may well use it inside that capture, which cudacore cannot see.
func (m *Manager) CheckGraphMemoryExport(op string, p cuda.DevicePtr, size uint64) error {
	if m.gm.active.Load() == 0 {
		return nil
	}
	return m.checkPendingEnded(op, []span{{p, p + cuda.DevicePtr(max(size, 1))}})
}

// GraphMemoryBytes is the graph memory that live graphs hold with no owner left: allocations whose
// Buffer was freed after a launch made them real (gmOrphan), which the driver keeps for the graph's
// launches until it goes. An allocation whose owner still holds it (pending or live) is in the allocator's
// in_use already, so it is not counted here: the out-of-memory verdict adds this to in_use as memory the
// process holds outside its allocator.
func (m *Manager) GraphMemoryBytes() uint64 {
	gm := &m.gm
	if gm.proper.Load() == 0 {
		return 0
	}
	gm.mu.Lock()
	defer gm.mu.Unlock()
	var n uint64
	for _, a := range gm.allocs {
		if a.state == gmOrphan {
			n += a.size
		}
	}
	return n
}
