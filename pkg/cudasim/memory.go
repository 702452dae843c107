package cudasim

import (
	"cmp"
	"fmt"
	"math/bits"
	"slices"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"unsafe"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// Device pointers of device i lie in [ptrBase + i<<52, +4 PiB): addresses that are non-canonical on
// x86-64 and arm64, so they can never alias host memory and a stray dereference faults at once.
const (
	ptrBase   = uint64(1) << 60
	ptrWindow = uint64(1) << 52
	ptrAlign  = 256
	// fullReserve is what the H100 context holds back: total 85,017,493,504 minus free 84,465,090,560.
	fullReserve = 552402944
)

// Heap clamp measured on the H100: asking for 64 TiB read back 17,681,179,680 of 85,017,493,504 bytes.
// The simulator clamps every device to the same fraction of its memory.
const (
	heapClampNum = 17681179680
	heapClampDen = 85017493504
)

type allocKind uint8

const (
	kindSync allocKind = iota
	kindManaged
	kindPool
	kindGraph
	kindImported  // cuMemPoolImportPointer: another process's pool block, freed with MemFree/MemFreeAsync
	kindIpcOpened // cuIpcOpenMemHandle: another process's allocation, closed with IpcCloseMemHandle
)

// alloc is one device allocation. data is made on first touch, so a large allocation nobody writes costs
// no host memory.
type alloc struct {
	base  uint64
	size  uint64 // what was asked for: the bounds copies are checked against
	block uint64 // what is accounted: size rounded up to ptrAlign, or the cached block reused
	kind  allocKind
	pool  *pool
	data  []byte
	// pending marks a pool block freed with cuMemFreeAsync whose free the stream has not yet reached: the
	// real driver cannot trim it back to the device until a synchronize, so neither can the simulator.
	pending bool
	// A graph allocation (kindGraph) is reserved for its graph's lifetime, and is live from the launch that
	// allocates it until it is freed (a free node, cuMemFreeAsync or cuMemFree), as with the real driver:
	// before its first launch it is no allocation at all, and one still live when its graph is destroyed
	// stays until it is freed (orphan: released then).
	graphLive, orphan bool
	// shm backs the bytes with shared memory instead of data: blocks of exportable pools, allocations
	// whose IPC handle was taken, and imports of either (multi.go).
	shm *shmMap
}

func (a *alloc) bytes() []byte {
	if a.shm != nil {
		return a.shm.mem[:a.size]
	}
	if a.data == nil {
		a.data = make([]byte, a.size)
	}
	return a.data
}

type pool struct {
	handle       cuda.MemPool
	isDefault    bool
	maxSize      uint64 // CUmemPoolProps.maxSize: the most the pool reserves (0: no cap)
	threshold    uint64
	reserved     uint64
	used         uint64
	reservedHigh uint64
	usedHigh     uint64
	cache        []*alloc // freed blocks kept reserved for reuse
	// Exportable and imported pools (multi.go): shared backs every block of an exportable pool; an
	// imported pool only maps blocks other processes allocated.
	shared   *shmFile
	imported bool
	access   map[int]cuda.AccessFlags // granted to other devices with cuMemPoolSetAccess
}

type device struct {
	drv   *Driver
	index int
	cfg   DeviceConfig

	mu      sync.Mutex
	ctxRefs int
	reserve uint64
	used    uint64 // allocations, pool reservations and graph memory; free = total - reserve - used
	next    uint64 // bump pointer: addresses are never reused, so a stale pointer never finds a new block
	live    []*alloc

	defaultPool *pool
	current     *pool // cuDeviceSetMemPool's pool, which cuMemAllocAsync allocates from
	pools       map[cuda.MemPool]*pool
	streams     map[cuda.Stream]*stream
	dead        map[cuda.Stream]struct{} // destroyed streams whose handle no new stream has taken
	deadStreams []cuda.Stream            // with conds.ReuseHandles: destroyed handles to hand out again
	perThread   map[int]*stream
	legacy      *stream
	events      map[cuda.Event]*event
	graphs      map[cuda.Graph]*graph
	execs       map[cuda.GraphExec]*graphExec
	modules     map[cuda.Module]*module
	funcs       map[cuda.Function]*function
	limits      map[cuda.Limit]uint64
	peers       map[int]bool // devices this context may access (cuCtxEnablePeerAccess)

	conds  MemoryConditions // see SetMemoryConditions
	others uint64           // the sum of conds.OtherProcesses
	reuse  []span           // with conds.ReuseAddresses: released address ranges, by address
}

// span is a released address range that ReuseAddresses hands out again.
type span struct{ base, block uint64 }

func newDevice(d *Driver, i int, cfg DeviceConfig) *device {
	v := &device{drv: d, index: i, cfg: cfg}
	v.reserve = min(uint64(fullReserve), cfg.TotalMemory/16)
	v.resetLocked()
	return v
}

// resetLocked returns the device to a fresh context's state.
func (v *device) resetLocked() {
	v.drv.capMu.Lock()
	for c := range v.drv.caps {
		if c.dev == v {
			delete(v.drv.caps, c)
		}
	}
	v.drv.capMu.Unlock()
	v.releaseShared()
	v.used = 0
	v.next = ptrBase + uint64(v.index)*ptrWindow
	v.reuse = nil
	v.deadStreams = nil
	v.live = nil
	v.pools = map[cuda.MemPool]*pool{}
	v.defaultPool = &pool{handle: cuda.MemPool(v.handle(kindPoolHandle)), isDefault: true}
	v.pools[v.defaultPool.handle] = v.defaultPool
	v.current = v.defaultPool
	v.streams = map[cuda.Stream]*stream{}
	v.perThread = map[int]*stream{}
	v.legacy = &stream{dev: v, handle: cuda.StreamLegacy, legacy: true}
	v.events = map[cuda.Event]*event{}
	v.graphs = map[cuda.Graph]*graph{}
	v.execs = map[cuda.GraphExec]*graphExec{}
	v.modules = map[cuda.Module]*module{}
	v.funcs = map[cuda.Function]*function{}
	v.peers = map[int]bool{}
	v.limits = map[cuda.Limit]uint64{
		cuda.LimitStackSize:                    1024,
		cuda.LimitPrintfFIFOSize:               8650752,
		cuda.LimitMallocHeapSize:               8388608,
		cuda.LimitDevRuntimeSyncDepth:          2,
		cuda.LimitDevRuntimePendingLaunchCount: 2048,
		cuda.LimitMaxL2FetchGranularity:        64,
		// The H100 read 9,830,400: 30% of its maximum (MAX_PERSISTING_L2_CACHE_SIZE, 32,768,000).
		cuda.LimitPersistingL2CacheSize: v.maxPersistingL2() * 3 / 10,
	}
}

// Handle kinds, in the top byte of every handle: a handle of one kind is never found among another's.
const (
	kindStreamHandle = iota + 1
	kindEventHandle
	kindGraphHandle
	kindExecHandle
	kindPoolHandle
	kindModuleHandle
	kindFuncHandle
)

func (v *device) handle(kind int) uint64 {
	return uint64(kind)<<56 | uint64(v.index)<<48 | v.drv.nextID.Add(1)&(1<<48-1)
}

// handleDevice returns the device a handle names, or nil.
func (d *Driver) handleDevice(h uint64, kind int) *device {
	if h>>56 != uint64(kind) {
		return nil
	}
	i := int(h >> 48 & 0xff)
	if i >= len(d.devs) {
		return nil
	}
	return d.devs[i]
}

func (v *device) maxPersistingL2() uint64 {
	if v.cfg.ComputeCapability[0] < 8 {
		return 0
	}
	return 32768000 // measured on the H100 (CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE)
}

func (v *device) heapMax() uint64 {
	hi, lo := bits.Mul64(v.cfg.TotalMemory, heapClampNum)
	q, _ := bits.Div64(hi, lo, heapClampDen)
	return q
}

func (v *device) free() uint64 { return v.cfg.TotalMemory - v.reserve - v.used - v.others }

func (v *device) noPools(op string) error {
	return errf(op, cuda.ErrorNotSupported, "device %d (%s) does not support memory pools", v.index, v.cfg.Name)
}

func (v *device) oom(op string, size uint64) error {
	return cuda.NewError(op, cuda.ErrorOutOfMemory,
		"device "+strconv.Itoa(v.index)+" has "+strconv.FormatUint(v.free(), 10)+" bytes free",
		cuda.Field{Key: "requested", Value: strconv.FormatUint(size, 10)},
		cuda.Field{Key: "free", Value: strconv.FormatUint(v.free(), 10)},
		cuda.Field{Key: "total", Value: strconv.FormatUint(v.cfg.TotalMemory, 10)})
}

func roundUp(n uint64) (uint64, bool) {
	r := (n + ptrAlign - 1) &^ (ptrAlign - 1)
	return r, r >= n
}

// newAlloc accounts and places a fresh allocation; the caller has checked size > 0.
func (v *device) newAlloc(op string, size uint64, kind allocKind) (*alloc, error) {
	block, ok := roundUp(size)
	if !ok || block > v.free() || v.conds.MaxBlock != 0 && block > v.conds.MaxBlock {
		return nil, v.oom(op, size)
	}
	end := ptrBase + uint64(v.index+1)*ptrWindow
	if block > end-v.next {
		return nil, errf(op, cuda.ErrorOutOfMemory, "the simulator's address window for device %d is used up", v.index)
	}
	a := &alloc{base: v.next, size: size, block: block, kind: kind}
	if base, ok := v.reused(block); ok {
		a.base = base
	} else {
		v.next += block
	}
	v.used += block
	v.insert(a)
	return a, nil
}

// reused takes the lowest released address with room for block bytes, as the real driver hands out the
// lowest free address of its reservations again whatever size was freed there (the graph memory of a
// destroyed graph for the next capture's allocation of another size, say); the rest of the range stays
// released.
func (v *device) reused(block uint64) (uint64, bool) {
	if !v.conds.ReuseAddresses {
		return 0, false
	}
	for i, r := range v.reuse {
		if r.block < block {
			continue
		}
		if r.block == block {
			v.reuse = slices.Delete(v.reuse, i, i+1)
		} else {
			v.reuse[i] = span{r.base + block, r.block - block}
		}
		return r.base, true
	}
	return 0, false
}

func (v *device) insert(a *alloc) {
	i := sort.Search(len(v.live), func(i int) bool { return v.live[i].base >= a.base })
	v.live = slices.Insert(v.live, i, a)
}

func (v *device) remove(a *alloc) {
	i := sort.Search(len(v.live), func(i int) bool { return v.live[i].base >= a.base })
	if i < len(v.live) && v.live[i] == a {
		v.live = slices.Delete(v.live, i, i+1)
	}
}

// find returns the allocation holding [p, p+n), with p's offset in it.
func (v *device) find(p cuda.DevicePtr, n uint64) (*alloc, uint64, bool) {
	u := uint64(p)
	i := sort.Search(len(v.live), func(i int) bool { return v.live[i].base > u }) - 1
	if i < 0 {
		return nil, 0, false
	}
	a := v.live[i]
	off := u - a.base
	if off >= a.size || n > a.size-off {
		return nil, 0, false
	}
	return a, off, true
}

// exact returns the allocation that starts at p.
func (v *device) exact(p cuda.DevicePtr) *alloc {
	a, off, ok := v.find(p, 1)
	if !ok || off != 0 {
		return nil
	}
	return a
}

func (v *device) release(a *alloc) {
	v.remove(a)
	if a.kind != kindImported && a.kind != kindIpcOpened {
		v.used -= a.block
		if v.conds.ReuseAddresses {
			i := sort.Search(len(v.reuse), func(i int) bool { return v.reuse[i].base >= a.base })
			v.reuse = slices.Insert(v.reuse, i, span{a.base, a.block})
		}
	}
	a.data = nil
	a.shm.unmap()
	a.shm = nil
}

func (d *Driver) MemGetInfo(c cuda.Context) (free, total uint64, err error) {
	v, err := d.ctx("cuMemGetInfo_v2", c)
	if err != nil {
		return 0, 0, err
	}
	defer v.mu.Unlock()
	return v.free(), v.cfg.TotalMemory, nil
}

func (d *Driver) MemAlloc(c cuda.Context, size uint64) (cuda.DevicePtr, error) {
	return d.memAllocSync("cuMemAlloc_v2", c, size, kindSync, 0)
}

func (d *Driver) MemAllocManaged(c cuda.Context, size uint64, flags uint32) (cuda.DevicePtr, error) {
	return d.memAllocSync("cuMemAllocManaged", c, size, kindManaged, flags)
}

func (d *Driver) memAllocSync(op string, c cuda.Context, size uint64, kind allocKind, flags uint32) (cuda.DevicePtr, error) {
	v, err := d.ctx(op, c)
	if err != nil {
		return 0, err
	}
	defer v.mu.Unlock()
	if kind == kindManaged {
		if !v.cfg.ManagedMemory {
			return 0, errf(op, cuda.ErrorNotSupported, "device %d does not support managed memory", v.index)
		}
		if flags != cuda.MemAttachGlobal && flags != 2 { // CU_MEM_ATTACH_HOST
			return 0, errf(op, cuda.ErrorInvalidValue, "flags %#x: want CU_MEM_ATTACH_GLOBAL or CU_MEM_ATTACH_HOST", flags)
		}
	}
	if err := d.unsafeCall(op, v); err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, errf(op, cuda.ErrorInvalidValue, "cannot allocate 0 bytes")
	}
	a, err := v.newAlloc(op, size, kind)
	if err != nil {
		return 0, err
	}
	return cuda.DevicePtr(a.base), nil
}

func (d *Driver) MemFree(c cuda.Context, p cuda.DevicePtr) error {
	const op = "cuMemFree_v2"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	if err := d.unsafeCall(op, v); err != nil {
		return err
	}
	return v.freePtr(op, p)
}

// freePtr frees p outside capture: pool blocks go back to their pool's cache, others to the device.
func (v *device) freePtr(op string, p cuda.DevicePtr) error {
	a := v.exact(p)
	if a == nil {
		return errf(op, cuda.ErrorInvalidValue, "%#x is not the start of a live allocation on device %d", uint64(p), v.index)
	}
	switch a.kind {
	case kindPool:
		v.remove(a)
		a.data = nil
		a.pool.used -= a.block
		a.pool.cache = append(a.pool.cache, a)
	case kindGraph:
		return v.freeGraphAlloc(op, a)
	case kindIpcOpened:
		return errf(op, cuda.ErrorInvalidValue, "%#x was opened from another process's IPC handle: close it with cuIpcCloseMemHandle", uint64(p))
	default:
		v.release(a)
	}
	return nil
}

func (d *Driver) MemAllocAsync(c cuda.Context, size uint64, s cuda.Stream) (cuda.DevicePtr, error) {
	const op = "cuMemAllocAsync"
	v, err := d.ctx(op, c)
	if err != nil {
		return 0, err
	}
	defer v.mu.Unlock()
	if !v.cfg.MemoryPoolsSupported {
		return 0, v.noPools(op)
	}
	return d.poolAlloc(op, v, v.current, size, s)
}

func (d *Driver) MemAllocFromPoolAsync(c cuda.Context, size uint64, mp cuda.MemPool, s cuda.Stream) (cuda.DevicePtr, error) {
	const op = "cuMemAllocFromPoolAsync"
	v, err := d.ctx(op, c)
	if err != nil {
		return 0, err
	}
	defer v.mu.Unlock()
	if !v.cfg.MemoryPoolsSupported {
		return 0, v.noPools(op)
	}
	p := v.pools[mp]
	if p == nil {
		return 0, errf(op, cuda.ErrorInvalidValue, "memory pool %#x is not a live pool of device %d", uint64(mp), v.index)
	}
	return d.poolAlloc(op, v, p, size, s)
}

func (d *Driver) poolAlloc(op string, v *device, p *pool, size uint64, sh cuda.Stream) (cuda.DevicePtr, error) {
	s, err := d.streamOp(op, v, sh)
	if err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, errf(op, cuda.ErrorInvalidValue, "cannot allocate 0 bytes")
	}
	if s.cap == nil {
		// Outside a capture, a stream-ordered allocation is a potentially unsafe call (measured on the
		// H200: 900 and the capture invalidated, on every stream and pool, GLOBAL from any thread and
		// THREAD_LOCAL from the capturing one).
		if err := d.unsafeCall(op, v); err != nil {
			return 0, err
		}
	}
	if s.cap != nil {
		// Graph memory: reserved now, so later captured copies can check their bounds against it, and
		// held until the graph and its execs are gone.
		a, err := v.newAlloc(op, size, kindGraph)
		if err != nil {
			return 0, err
		}
		s.cap.allocs = append(s.cap.allocs, a)
		s.cap.add(s, node{kind: nodeAlloc, dst: cuda.DevicePtr(a.base), n: size})
		return cuda.DevicePtr(a.base), nil
	}
	block, ok := roundUp(size)
	if !ok {
		return 0, v.oom(op, size)
	}
	best := -1
	for i, a := range p.cache {
		if a.block >= block && a.block <= 2*block && (best < 0 || a.block < p.cache[best].block) {
			best = i
		}
	}
	var a *alloc
	if best >= 0 {
		a = p.cache[best]
		p.cache = slices.Delete(p.cache, best, best+1)
		a.size = size
		v.insert(a)
	} else {
		if block > v.free() {
			v.trimPool(p, 0) // the driver gives back this pool's unused blocks before it reports OOM
		}
		if p.imported {
			return 0, errf(op, cuda.ErrorInvalidValue, "pool %#x was imported from another process: only its owner allocates from it", uint64(p.handle))
		}
		if lim := v.conds.PoolReservationLimit; lim != 0 && (block > lim || p.reserved > lim-block) {
			v.trimPool(p, 0)
			if block > lim || p.reserved > lim-block {
				return 0, v.oom(op, size)
			}
		}
		if lim := p.maxSize; lim != 0 && (block > lim || p.reserved > lim-block) {
			// A pool at its maximum size gives back its own unused blocks before it refuses, as it does
			// before a device out of memory.
			v.trimPool(p, 0)
			if block > lim || p.reserved > lim-block {
				return 0, cuda.NewError(op, cuda.ErrorOutOfMemory, fmt.Sprintf(
					"memory pool %#x reserves %d of its maximum size of %d bytes: %d more do not fit",
					uint64(p.handle), p.reserved, lim, block),
					cuda.Field{Key: "requested", Value: strconv.FormatUint(size, 10)},
					cuda.Field{Key: "free", Value: strconv.FormatUint(v.free(), 10)},
					cuda.Field{Key: "total", Value: strconv.FormatUint(v.cfg.TotalMemory, 10)})
			}
		}
		a, err = v.newAlloc(op, size, kindPool)
		if err != nil {
			return 0, err
		}
		if p.shared != nil {
			if a.shm, err = p.shared.place(op, a.block); err != nil {
				v.release(a)
				return 0, err
			}
		}
		a.pool = p
		p.reserved += a.block
		p.reservedHigh = max(p.reservedHigh, p.reserved)
	}
	p.used += a.block
	p.usedHigh = max(p.usedHigh, p.used)
	return cuda.DevicePtr(a.base), nil
}

func (d *Driver) MemFreeAsync(c cuda.Context, ptr cuda.DevicePtr, sh cuda.Stream) error {
	const op = "cuMemFreeAsync"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	if !v.cfg.MemoryPoolsSupported {
		return v.noPools(op)
	}
	s, err := d.streamOp(op, v, sh)
	if err != nil {
		return err
	}
	if s.cap != nil {
		a := v.exact(ptr)
		if a == nil || a.kind != kindGraph {
			return errf(op, cuda.ErrorInvalidValue, "%#x is not graph memory: during capture only memory allocated in a graph can be freed", uint64(ptr))
		}
		s.cap.add(s, node{kind: nodeFree, dst: ptr})
		return nil
	}
	if err := d.unsafeCall(op, v); err != nil { // as a stream-ordered allocation outside a capture is
		return err
	}
	a := v.exact(ptr)
	if err := v.freePtr(op, ptr); err != nil {
		return err
	}
	if a.kind == kindPool {
		a.pending = true
	}
	return nil
}

// trimPool releases cached blocks, largest first, until the pool reserves at most keep bytes.
func (v *device) trimPool(p *pool, keep uint64) {
	if p.reserved <= keep || len(p.cache) == 0 {
		return
	}
	slices.SortFunc(p.cache, func(a, b *alloc) int { return cmp.Compare(b.block, a.block) })
	kept := p.cache[:0]
	for _, a := range p.cache {
		if a.pending || p.reserved <= keep {
			kept = append(kept, a)
			continue
		}
		p.reserved -= a.block
		v.used -= a.block
		a.shm.unmap()
		a.shm = nil
	}
	clear(p.cache[len(kept):])
	p.cache = slices.Clip(kept)
}

// syncPoint is what a synchronize does to memory: the stream-ordered frees complete, then every pool
// gives back what lies above its threshold.
func (v *device) syncPoint() {
	for _, p := range v.pools {
		for _, a := range p.cache {
			a.pending = false
		}
		v.trimPool(p, p.threshold)
	}
}

func (d *Driver) poolOf(op string, v *device, mp cuda.MemPool) (*pool, error) {
	if !v.cfg.MemoryPoolsSupported {
		return nil, v.noPools(op)
	}
	p := v.pools[mp]
	if p == nil {
		return nil, errf(op, cuda.ErrorInvalidValue, "memory pool %#x is not a live pool of device %d", uint64(mp), v.index)
	}
	return p, nil
}

// MemPoolCreate implements cuMemPoolCreate for a pool of pinned device memory on props.Device, which must
// be the context's device in the simulator. An exportable pool (HandlePosixFD, the only handle type on
// Linux) keeps its blocks in shared memory (multi.go).
func (d *Driver) MemPoolCreate(c cuda.Context, props cuda.PoolProps) (cuda.MemPool, error) {
	const op = "cuMemPoolCreate"
	v, err := d.ctx(op, c)
	if err != nil {
		return 0, err
	}
	defer v.mu.Unlock()
	dev := props.Device
	if dev < 0 || int(dev) >= len(d.devs) {
		return 0, errf(op, cuda.ErrorInvalidDevice, "device %d does not exist", dev)
	}
	if !v.cfg.MemoryPoolsSupported {
		return 0, v.noPools(op)
	}
	if int(dev) != v.index {
		return 0, errf(op, cuda.ErrorNotSupported, "the simulator creates pools only on the context's device (%d), not %d", v.index, dev)
	}
	if ht := props.HandleTypes; ht != cuda.HandleNone && ht != cuda.HandlePosixFD {
		return 0, errf(op, cuda.ErrorNotSupported, "handle type %d is not supported on Linux by the simulator (POSIX file descriptors are)", ht)
	}
	if props.MaxSize != 0 && d.version < cuda.PoolMaxSizeVersion {
		return 0, cuda.MaxSizeUnsupported(op, d.version)
	}
	p := &pool{handle: cuda.MemPool(v.handle(kindPoolHandle)), maxSize: props.MaxSize}
	if props.HandleTypes == cuda.HandlePosixFD {
		if p.shared, err = newShmFile(op, magicPoolFile, v.index, uint64(p.handle)); err != nil {
			return 0, err
		}
	}
	v.pools[p.handle] = p
	return p.handle, nil
}

func (d *Driver) MemPoolDestroy(c cuda.Context, mp cuda.MemPool) error {
	const op = "cuMemPoolDestroy"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	p, err := d.poolOf(op, v, mp)
	if err != nil {
		return err
	}
	if p.isDefault {
		return errf(op, cuda.ErrorInvalidValue, "the default pool of device %d cannot be destroyed", v.index)
	}
	v.trimPool(p, 0)
	delete(v.pools, mp)
	if v.current == p {
		v.current = v.defaultPool // as the driver documents for the current pool's destruction
	}
	p.shared.close() // blocks still allocated from it keep their mappings
	// Blocks still allocated from it stay valid and are released when freed; their pool is gone, so
	// they no longer return to a cache.
	for _, a := range v.live {
		if a.pool == p {
			a.kind, a.pool = kindSync, nil
			p.reserved -= a.block
		}
	}
	return nil
}

func (d *Driver) MemPoolSetAttribute(c cuda.Context, mp cuda.MemPool, attr cuda.MemPoolAttribute, val uint64) error {
	const op = "cuMemPoolSetAttribute"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	p, err := d.poolOf(op, v, mp)
	if err != nil {
		return err
	}
	switch attr {
	case cuda.PoolAttrReleaseThreshold:
		p.threshold = val
	case cuda.PoolAttrReservedMemHigh, cuda.PoolAttrUsedMemHigh:
		if val != 0 {
			return errf(op, cuda.ErrorInvalidValue, "a high-water mark can only be reset, with 0")
		}
		if attr == cuda.PoolAttrReservedMemHigh {
			p.reservedHigh = p.reserved
		} else {
			p.usedHigh = p.used
		}
	default:
		return errf(op, cuda.ErrorInvalidValue, "pool attribute %d cannot be set", attr)
	}
	return nil
}

func (d *Driver) MemPoolGetAttribute(c cuda.Context, mp cuda.MemPool, attr cuda.MemPoolAttribute) (uint64, error) {
	const op = "cuMemPoolGetAttribute"
	v, err := d.ctx(op, c)
	if err != nil {
		return 0, err
	}
	defer v.mu.Unlock()
	p, err := d.poolOf(op, v, mp)
	if err != nil {
		return 0, err
	}
	if attr != cuda.PoolAttrReleaseThreshold {
		// A usage query is an unsafe call during capture (measured on the H100).
		if err := d.unsafeCall(op, v); err != nil {
			return 0, err
		}
	}
	switch attr {
	case cuda.PoolAttrReleaseThreshold:
		return p.threshold, nil
	case cuda.PoolAttrReservedMemCurrent:
		return p.reserved, nil
	case cuda.PoolAttrReservedMemHigh:
		return p.reservedHigh, nil
	case cuda.PoolAttrUsedMemCurrent:
		return p.used, nil
	case cuda.PoolAttrUsedMemHigh:
		return p.usedHigh, nil
	}
	return 0, errf(op, cuda.ErrorInvalidValue, "pool attribute %d is not one the simulator models", attr)
}

func (d *Driver) MemPoolTrimTo(c cuda.Context, mp cuda.MemPool, keep uint64) error {
	const op = "cuMemPoolTrimTo"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	p, err := d.poolOf(op, v, mp)
	if err != nil {
		return err
	}
	v.trimPool(p, keep)
	return nil
}

// MemHostAlloc implements cuMemHostAlloc with an anonymous mapping: outside the Go heap, so its address
// never moves and the garbage collector never scans it, like real pinned memory.
func (d *Driver) MemHostAlloc(c cuda.Context, size uint64, flags uint32) ([]byte, error) {
	const op = "cuMemHostAlloc"
	v, err := d.ctx(op, c)
	if err != nil {
		return nil, err
	}
	v.mu.Unlock()
	if size == 0 {
		return nil, errf(op, cuda.ErrorInvalidValue, "cannot allocate 0 bytes")
	}
	if flags&^(cuda.HostAllocPortable|cuda.HostAllocDeviceMap|cuda.HostAllocWriteCombined) != 0 {
		return nil, errf(op, cuda.ErrorInvalidValue, "unknown flags %#x", flags)
	}
	if size > 1<<46 || int(size) < 0 {
		return nil, errf(op, cuda.ErrorOutOfMemory, "cannot pin %d bytes of host memory", size)
	}
	b, merr := syscall.Mmap(-1, 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if merr != nil {
		return nil, &cuda.Error{Op: op, Result: cuda.ErrorOutOfMemory, Msg: "mmap failed", Err: merr}
	}
	d.hostMu.Lock()
	d.pinned[uintptr(unsafe.Pointer(&b[0]))] = b
	d.hostMu.Unlock()
	return b, nil
}

func (d *Driver) MemFreeHost(c cuda.Context, b []byte) error {
	const op = "cuMemFreeHost"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	uerr := d.unsafeCall(op, v)
	v.mu.Unlock()
	if uerr != nil {
		return uerr
	}
	if len(b) == 0 {
		return errf(op, cuda.ErrorInvalidValue, "empty slice: not memory from MemHostAlloc")
	}
	base := uintptr(unsafe.Pointer(&b[0]))
	d.hostMu.Lock()
	m, ok := d.pinned[base]
	if ok {
		delete(d.pinned, base)
	}
	d.hostMu.Unlock()
	if !ok {
		return errf(op, cuda.ErrorInvalidValue, "%#x is not the start of memory from MemHostAlloc", base)
	}
	if err := syscall.Munmap(m); err != nil {
		return &cuda.Error{Op: op, Result: cuda.ErrorInvalidValue, Msg: "munmap failed", Err: err}
	}
	return nil
}

// pinnedBase returns the MemHostAlloc mapping holding b, if any.
func (d *Driver) pinnedBase(b []byte) (uintptr, bool) {
	if len(b) == 0 {
		return 0, false
	}
	p := uintptr(unsafe.Pointer(&b[0]))
	d.hostMu.Lock()
	defer d.hostMu.Unlock()
	for base, m := range d.pinned {
		if p >= base && p+uintptr(len(b)) <= base+uintptr(len(m)) {
			return base, true
		}
	}
	return 0, false
}

func (d *Driver) stillPinned(base uintptr) bool {
	d.hostMu.Lock()
	defer d.hostMu.Unlock()
	_, ok := d.pinned[base]
	return ok
}
