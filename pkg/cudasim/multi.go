package cudasim

import (
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// Several devices and several processes.
//
// Peer access: devices of one PeerGroup can access each other (DeviceConfig.PeerGroup), others cannot.
// Enabling access is recorded per context and checked as the driver does; a peer copy moves real bytes
// between the two devices' allocations.
//
// Processes: the simulator is host memory in one process, so memory that another process can open lives
// in shared memory: an exportable pool keeps every block in one memfd, and an allocation whose IPC handle
// is taken moves into a memfd of its own. Page 0 of each file is a header naming its owner (process,
// device, allocation or pool), so an importer can tell a live export from a stale one. A cuIpc handle
// carries the exporter's pid and descriptor number and is opened through /proc/<pid>/fd, which is how a
// second process reaches the file without the driver's own channel; a pool travels as a file descriptor
// the caller passes (SCM_RIGHTS), as with the real driver. Work is synchronous, so an event opened from
// another process is always complete.

const pageSize = 4096

var (
	magicMemFile  = [8]byte{'c', 'c', 's', 'i', 'm', 'M', 'E', 'M'}
	magicPoolFile = [8]byte{'c', 'c', 's', 'i', 'm', 'P', 'O', 'L'}
	magicMem      = [8]byte{'c', 'c', 's', 'i', 'm', 'I', 'P', 'C'}
	magicPtr      = [8]byte{'c', 'c', 's', 'i', 'm', 'P', 'P', 'D'}
	magicEvent    = [8]byte{'c', 'c', 's', 'i', 'm', 'E', 'V', 'T'}
)

// shmFile is a memfd with a header page; blocks are placed after it at page-aligned offsets that are never
// reused, so a stale export data can never name a newer block.
type shmFile struct {
	fd   int
	next int64
	id   uint64 // the allocation base or pool handle the header names
}

type shmMap struct {
	mem  []byte
	own  *shmFile // closed with the mapping: the file of a single allocation
	file *shmFile // the file the mapping lies in (an exportable pool's, or own)
	off  int64
}

func pageRound(n uint64) uint64 { return (n + pageSize - 1) &^ (pageSize - 1) }

func newShmFile(op string, magic [8]byte, dev int, id uint64) (*shmFile, error) {
	fd, err := unix.MemfdCreate("cudasim-"+strconv.FormatUint(id, 16), unix.MFD_CLOEXEC)
	if err != nil {
		return nil, &cuda.Error{Op: op, Result: cuda.ErrorOutOfMemory, Msg: "memfd_create failed", Err: err}
	}
	var hdr [24]byte
	copy(hdr[:8], magic[:])
	binary.LittleEndian.PutUint32(hdr[8:], uint32(os.Getpid()))
	binary.LittleEndian.PutUint32(hdr[12:], uint32(dev))
	binary.LittleEndian.PutUint64(hdr[16:], id)
	if err := unix.Ftruncate(fd, pageSize); err != nil {
		_ = unix.Close(fd)
		return nil, &cuda.Error{Op: op, Result: cuda.ErrorOutOfMemory, Msg: "ftruncate failed", Err: err}
	}
	if _, err := unix.Pwrite(fd, hdr[:], 0); err != nil {
		_ = unix.Close(fd)
		return nil, &cuda.Error{Op: op, Result: cuda.ErrorOutOfMemory, Msg: "writing the header failed", Err: err}
	}
	return &shmFile{fd: fd, next: pageSize, id: id}, nil
}

// place maps a fresh range of n bytes of the file.
func (f *shmFile) place(op string, n uint64) (*shmMap, error) {
	size := int64(pageRound(n))
	off := f.next
	if err := unix.Ftruncate(f.fd, off+size); err != nil {
		return nil, &cuda.Error{Op: op, Result: cuda.ErrorOutOfMemory, Msg: "ftruncate failed", Err: err}
	}
	m, err := mapFile(op, f.fd, off, uint64(size))
	if err != nil {
		return nil, err
	}
	f.next += size
	m.file, m.off = f, off
	return m, nil
}

func mapFile(op string, fd int, off int64, n uint64) (*shmMap, error) {
	mem, err := unix.Mmap(fd, off, int(pageRound(n)), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, &cuda.Error{Op: op, Result: cuda.ErrorOutOfMemory, Msg: "mmap failed", Err: err}
	}
	return &shmMap{mem: mem}, nil
}

func (m *shmMap) unmap() {
	if m == nil {
		return
	}
	_ = unix.Munmap(m.mem)
	if m.own != nil {
		_ = unix.Close(m.own.fd)
	}
}

// readHeader reads a file's header: magic, owner pid, device and id.
func readHeader(fd int) (magic [8]byte, pid int, dev int, id uint64, ok bool) {
	var hdr [24]byte
	if n, err := unix.Pread(fd, hdr[:], 0); err != nil || n != len(hdr) {
		return magic, 0, 0, 0, false
	}
	copy(magic[:], hdr[:8])
	return magic, int(binary.LittleEndian.Uint32(hdr[8:])), int(binary.LittleEndian.Uint32(hdr[12:])),
		binary.LittleEndian.Uint64(hdr[16:]), true
}

// ---- peers ------------------------------------------------------------------------------------------

// ctxDevice validates a context handle without locking its device.
func (d *Driver) ctxDevice(op string, c cuda.Context) (*device, error) {
	u := uintptr(c)
	if u < ctxBase || (u-ctxBase)%ctxStride != 0 || int((u-ctxBase)/ctxStride) >= len(d.devs) {
		return nil, errf(op, cuda.ErrorInvalidContext, "context %#x is not one this simulator made", u)
	}
	return d.devs[(u-ctxBase)/ctxStride], nil
}

// lockAll locks the distinct devices of the contexts in ordinal order (so two calls never deadlock),
// checks that each is retained, and returns the devices in argument order and the unlock function.
func (d *Driver) lockAll(op string, ctxs ...cuda.Context) ([]*device, func(), error) {
	if err := d.enter(op); err != nil {
		return nil, nil, err
	}
	devs := make([]*device, len(ctxs))
	for i, c := range ctxs {
		v, err := d.ctxDevice(op, c)
		if err != nil {
			return nil, nil, err
		}
		devs[i] = v
	}
	order := slices.Clone(devs)
	slices.SortFunc(order, func(a, b *device) int { return a.index - b.index })
	order = slices.Compact(order)
	for _, v := range order {
		v.mu.Lock()
	}
	unlock := func() {
		for _, v := range order {
			v.mu.Unlock()
		}
	}
	for i, v := range devs {
		if v.ctxRefs == 0 {
			unlock()
			return nil, nil, errf(op, cuda.ErrorInvalidContext, "context %#x was released", uintptr(ctxs[i]))
		}
	}
	return devs, unlock, nil
}

func (d *Driver) canPeer(a, b *device) bool { return a != b && a.cfg.PeerGroup == b.cfg.PeerGroup }

// DeviceCanAccessPeer implements cuDeviceCanAccessPeer: devices of one peer group, never a device itself.
func (d *Driver) DeviceCanAccessPeer(dev, peer cuda.Device) (bool, error) {
	const op = "cuDeviceCanAccessPeer"
	v, err := d.device(op, dev)
	if err != nil {
		return false, err
	}
	if peer < 0 || int(peer) >= len(d.devs) {
		return false, errf(op, cuda.ErrorInvalidDevice, "device %d does not exist; there are %d", peer, len(d.devs))
	}
	return d.canPeer(v, d.devs[peer]), nil
}

// nvlinks is how many NVLinks join a and b: the smaller of their counts, for devices of one peer group.
func (d *Driver) nvlinks(a, b *device) int {
	if !d.canPeer(a, b) {
		return 0
	}
	return min(a.cfg.NVLinks, b.cfg.NVLinks)
}

// DeviceGetP2PAttribute implements cuDeviceGetP2PAttribute. Between peers the model answers access
// supported; native atomics and performance rank 0 over NVLink, no atomics and rank 1 over PCIe; devices
// that are not peers get 0 for every attribute. A device with itself is CUDA_ERROR_INVALID_DEVICE.
func (d *Driver) DeviceGetP2PAttribute(attr cuda.P2PAttribute, src, dst cuda.Device) (int, error) {
	const op = "cuDeviceGetP2PAttribute"
	v, err := d.device(op, src)
	if err != nil {
		return 0, err
	}
	if dst < 0 || int(dst) >= len(d.devs) {
		return 0, errf(op, cuda.ErrorInvalidDevice, "device %d does not exist; there are %d", dst, len(d.devs))
	}
	if src == dst {
		return 0, errf(op, cuda.ErrorInvalidDevice, "device %d is itself: the attributes describe the path between two devices", src)
	}
	p := d.devs[dst]
	peer, links := d.canPeer(v, p), d.nvlinks(v, p)
	switch attr {
	case cuda.P2PAccessSupported:
		return b2i(peer), nil
	case cuda.P2PNativeAtomicSupport:
		return b2i(links > 0), nil
	case cuda.P2PPerformanceRank:
		return b2i(peer && links == 0), nil
	}
	return 0, errf(op, cuda.ErrorInvalidValue, "unknown peer-to-peer attribute %d", attr)
}

// NVMLLink is what the simulated NVML says of the link between two devices, in the terms of the real one
// (libcuda.LinkBetween): the NVLinks joining them (none through an NVSwitch in the model), and the PCIe
// tree's common ancestor, a single switch (10) between peers and across NUMA nodes (50) otherwise.
type NVMLLink struct {
	DirectLinks int
	Ancestor    int
}

// LinkBetween answers as NVML would for ordinals a and b; ok is false for an ordinal the simulator does
// not have, or when the memory conditions of either model no NVML (SetMemoryConditions' NoNVML).
func (d *Driver) LinkBetween(a, b int) (NVMLLink, bool) {
	if a < 0 || a >= len(d.devs) || b < 0 || b >= len(d.devs) {
		return NVMLLink{}, false
	}
	va, vb := d.devs[a], d.devs[b]
	for _, v := range []*device{va, vb} {
		v.mu.Lock()
		no := v.conds.NoNVML
		v.mu.Unlock()
		if no {
			return NVMLLink{}, false
		}
	}
	link := NVMLLink{DirectLinks: d.nvlinks(va, vb), Ancestor: 50}
	if d.canPeer(va, vb) {
		link.Ancestor = 10
	}
	return link, true
}

// PointerGetAttribute implements cuPointerGetAttribute for the two attributes the model has: cuMemAlloc
// memory is legacy-IPC capable, and a block of an exportable pool can be exported as a file descriptor.
func (d *Driver) PointerGetAttribute(c cuda.Context, attr cuda.PointerAttribute, ptr cuda.DevicePtr) (uint64, error) {
	const op = "cuPointerGetAttribute"
	v, err := d.ctx(op, c)
	if err != nil {
		return 0, err
	}
	defer v.mu.Unlock()
	a, _, ok := v.find(ptr, 1)
	if !ok {
		return 0, errf(op, cuda.ErrorInvalidValue, "%#x is not memory of device %d", uint64(ptr), v.index)
	}
	switch attr {
	case cuda.PointerLegacyIpcCapable:
		return uint64(b2i(a.kind == kindSync)), nil
	case cuda.PointerAllowedHandleTypes:
		if a.kind == kindPool && a.pool != nil && a.pool.shared != nil {
			return uint64(cuda.HandlePosixFD), nil
		}
		return 0, nil
	}
	return 0, errf(op, cuda.ErrorNotSupported, "the simulator models pointer attributes %d and %d, not %d",
		cuda.PointerLegacyIpcCapable, cuda.PointerAllowedHandleTypes, attr)
}

// MemRetainAllocationHandle implements cuMemRetainAllocationHandle. The simulator maps nothing with
// cuMemMap, so no memory has a physical allocation handle: cuMemAlloc's and pool blocks are refused
// (docs/contributing/driver-facts.md, "NCCL's user buffers", says what the real driver answered).
func (d *Driver) MemRetainAllocationHandle(c cuda.Context, ptr cuda.DevicePtr) (cuda.MemHandle, error) {
	const op = "cuMemRetainAllocationHandle"
	v, err := d.ctx(op, c)
	if err != nil {
		return 0, err
	}
	defer v.mu.Unlock()
	return 0, errf(op, cuda.ErrorInvalidValue, "%#x was not mapped with cuMemMap on device %d", uint64(ptr), v.index)
}

// MemRelease implements cuMemRelease: no handle of the simulator's is ever retained, so every one is
// unknown.
func (d *Driver) MemRelease(c cuda.Context, h cuda.MemHandle) error {
	const op = "cuMemRelease"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	return errf(op, cuda.ErrorInvalidValue, "%#x is not an allocation handle of device %d", uint64(h), v.index)
}

// CtxEnablePeerAccess implements cuCtxEnablePeerAccess.
func (d *Driver) CtxEnablePeerAccess(c, peer cuda.Context) error {
	const op = "cuCtxEnablePeerAccess"
	devs, unlock, err := d.lockAll(op, c, peer)
	if err != nil {
		return err
	}
	defer unlock()
	v, p := devs[0], devs[1]
	switch {
	case v == p:
		return errf(op, cuda.ErrorInvalidValue, "a context cannot enable peer access to itself")
	case !d.canPeer(v, p):
		return errf(op, cuda.ErrorPeerAccessUnsupported, "device %d cannot access device %d (peer groups %d and %d)",
			v.index, p.index, v.cfg.PeerGroup, p.cfg.PeerGroup)
	case v.peers[p.index]:
		return errf(op, cuda.ErrorPeerAccessAlreadyEnabled, "device %d already has access to device %d", v.index, p.index)
	}
	if v.peers == nil {
		v.peers = map[int]bool{}
	}
	v.peers[p.index] = true
	return nil
}

// MemcpyPeerAsync implements cuMemcpyPeerAsync. Like the driver, it needs no peer access (the driver
// stages through the host then); the stream must be one of c's.
func (d *Driver) MemcpyPeerAsync(c cuda.Context, dst cuda.DevicePtr, dstCtx cuda.Context, src cuda.DevicePtr, srcCtx cuda.Context, n uint64, sh cuda.Stream) error {
	const op = "cuMemcpyPeerAsync"
	devs, unlock, err := d.lockAll(op, c, dstCtx, srcCtx)
	if err != nil {
		return err
	}
	defer unlock()
	v, dv, sv := devs[0], devs[1], devs[2]
	s, err := d.streamOp(op, v, sh)
	if err != nil {
		return err
	}
	if s.cap != nil {
		return errf(op, cuda.ErrorNotSupported, "the simulator does not capture peer copies")
	}
	if n == 0 {
		return nil
	}
	sa, soff, ok := sv.find(src, n)
	if !ok {
		return sv.outOfBounds(op, src, n)
	}
	da, doff, ok := dv.find(dst, n)
	if !ok {
		return dv.outOfBounds(op, dst, n)
	}
	copy(da.bytes()[doff:doff+n], sa.bytes()[soff:soff+n])
	return nil
}

// MemPoolSetAccess implements cuMemPoolSetAccess for one device.
func (d *Driver) MemPoolSetAccess(c cuda.Context, mp cuda.MemPool, dev cuda.Device, flags cuda.AccessFlags) error {
	const op = "cuMemPoolSetAccess"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	p, err := d.poolOf(op, v, mp)
	if err != nil {
		return err
	}
	if dev < 0 || int(dev) >= len(d.devs) {
		return errf(op, cuda.ErrorInvalidDevice, "device %d does not exist; there are %d", dev, len(d.devs))
	}
	if flags != cuda.AccessNone && flags != cuda.AccessRead && flags != cuda.AccessReadWrite {
		return errf(op, cuda.ErrorInvalidValue, "access flags %d: want 0 (none), 1 (read) or 3 (read and write)", flags)
	}
	peer := d.devs[dev]
	if peer == v {
		if flags != cuda.AccessReadWrite {
			return errf(op, cuda.ErrorInvalidValue, "the pool's own device %d always has read-write access", v.index)
		}
		return nil
	}
	if !d.canPeer(v, peer) {
		return errf(op, cuda.ErrorInvalidDevice, "device %d cannot access device %d's memory (no peer access)", peer.index, v.index)
	}
	if p.access == nil {
		p.access = map[int]cuda.AccessFlags{}
	}
	p.access[peer.index] = flags
	return nil
}

// MemPoolGetAccess implements cuMemPoolGetAccess.
func (d *Driver) MemPoolGetAccess(c cuda.Context, mp cuda.MemPool, dev cuda.Device) (cuda.AccessFlags, error) {
	const op = "cuMemPoolGetAccess"
	v, err := d.ctx(op, c)
	if err != nil {
		return 0, err
	}
	defer v.mu.Unlock()
	p, err := d.poolOf(op, v, mp)
	if err != nil {
		return 0, err
	}
	if dev < 0 || int(dev) >= len(d.devs) {
		return 0, errf(op, cuda.ErrorInvalidDevice, "device %d does not exist; there are %d", dev, len(d.devs))
	}
	if int(dev) == v.index {
		return cuda.AccessReadWrite, nil
	}
	return p.access[int(dev)], nil
}

// ---- exportable pools ---------------------------------------------------------------------------------

// MemPoolExportToShareableHandle implements cuMemPoolExportToShareableHandle: a new descriptor of the
// pool's file, which the caller owns.
func (d *Driver) MemPoolExportToShareableHandle(c cuda.Context, mp cuda.MemPool, ht cuda.HandleType) (int, error) {
	const op = "cuMemPoolExportToShareableHandle"
	v, err := d.ctx(op, c)
	if err != nil {
		return -1, err
	}
	defer v.mu.Unlock()
	p, err := d.poolOf(op, v, mp)
	if err != nil {
		return -1, err
	}
	if p.shared == nil || p.imported {
		return -1, errf(op, cuda.ErrorInvalidValue, "pool %#x was not created exportable (handle type POSIX file descriptor)", uint64(mp))
	}
	if ht != cuda.HandlePosixFD {
		return -1, errf(op, cuda.ErrorInvalidValue, "pool %#x exports POSIX file descriptors, not handle type %d", uint64(mp), ht)
	}
	fd, err := unix.FcntlInt(uintptr(p.shared.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, &cuda.Error{Op: op, Result: cuda.ErrorOutOfMemory, Msg: "dup failed", Err: err}
	}
	return fd, nil
}

// MemPoolImportFromShareableHandle implements cuMemPoolImportFromShareableHandle; fd stays the caller's.
func (d *Driver) MemPoolImportFromShareableHandle(c cuda.Context, fd int, ht cuda.HandleType) (cuda.MemPool, error) {
	const op = "cuMemPoolImportFromShareableHandle"
	v, err := d.ctx(op, c)
	if err != nil {
		return 0, err
	}
	defer v.mu.Unlock()
	if ht != cuda.HandlePosixFD {
		return 0, errf(op, cuda.ErrorInvalidValue, "handle type %d: the simulator imports POSIX file descriptors", ht)
	}
	magic, _, _, id, ok := readHeader(fd)
	if !ok || magic != magicPoolFile {
		return 0, errf(op, cuda.ErrorInvalidValue, "file descriptor %d is not an exported memory pool", fd)
	}
	own, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return 0, &cuda.Error{Op: op, Result: cuda.ErrorOutOfMemory, Msg: "dup failed", Err: err}
	}
	p := &pool{handle: cuda.MemPool(v.handle(kindPoolHandle)), imported: true, shared: &shmFile{fd: own, id: id}}
	v.pools[p.handle] = p
	return p.handle, nil
}

// MemPoolExportPointer implements cuMemPoolExportPointer.
func (d *Driver) MemPoolExportPointer(c cuda.Context, ptr cuda.DevicePtr) (cuda.IpcHandle, error) {
	const op = "cuMemPoolExportPointer"
	var h cuda.IpcHandle
	v, err := d.ctx(op, c)
	if err != nil {
		return h, err
	}
	defer v.mu.Unlock()
	a := v.exact(ptr)
	if a == nil || a.kind != kindPool || a.pool.shared == nil || a.shm == nil {
		return h, errf(op, cuda.ErrorInvalidValue, "%#x is not the start of an allocation of an exportable pool of device %d", uint64(ptr), v.index)
	}
	copy(h[:8], magicPtr[:])
	binary.LittleEndian.PutUint64(h[8:], a.pool.shared.id)
	binary.LittleEndian.PutUint64(h[16:], uint64(a.shm.off))
	binary.LittleEndian.PutUint64(h[24:], a.size)
	return h, nil
}

// MemPoolImportPointer implements cuMemPoolImportPointer: the block is mapped from the pool's file.
func (d *Driver) MemPoolImportPointer(c cuda.Context, mp cuda.MemPool, data cuda.IpcHandle) (cuda.DevicePtr, error) {
	const op = "cuMemPoolImportPointer"
	v, err := d.ctx(op, c)
	if err != nil {
		return 0, err
	}
	defer v.mu.Unlock()
	p, err := d.poolOf(op, v, mp)
	if err != nil {
		return 0, err
	}
	if !p.imported {
		return 0, errf(op, cuda.ErrorInvalidValue, "pool %#x was not imported from another process", uint64(mp))
	}
	if [8]byte(data[:8]) != magicPtr || binary.LittleEndian.Uint64(data[8:]) != p.shared.id {
		return 0, errf(op, cuda.ErrorInvalidValue, "the export data does not name an allocation of pool %#x", uint64(mp))
	}
	off := int64(binary.LittleEndian.Uint64(data[16:]))
	size := binary.LittleEndian.Uint64(data[24:])
	var st unix.Stat_t
	if size == 0 || off < pageSize || off%pageSize != 0 || unix.Fstat(p.shared.fd, &st) != nil || uint64(st.Size) < uint64(off)+size {
		return 0, errf(op, cuda.ErrorInvalidValue, "the export data names no allocation of the pool's file")
	}
	return v.mapImport(op, p.shared.fd, off, size, kindImported)
}

// mapImport maps [off, off+size) of fd as a new allocation of v that v does not account.
func (v *device) mapImport(op string, fd int, off int64, size uint64, kind allocKind) (cuda.DevicePtr, error) {
	m, err := mapFile(op, fd, off, size)
	if err != nil {
		return 0, err
	}
	block, _ := roundUp(size)
	end := ptrBase + uint64(v.index+1)*ptrWindow
	if block > end-v.next {
		m.unmap()
		return 0, errf(op, cuda.ErrorOutOfMemory, "the simulator's address window for device %d is used up", v.index)
	}
	a := &alloc{base: v.next, size: size, block: block, kind: kind, shm: m}
	v.next += block
	v.insert(a)
	return cuda.DevicePtr(a.base), nil
}

// ---- cuIpc memory handles -------------------------------------------------------------------------------

// IpcGetMemHandle implements cuIpcGetMemHandle for cuMemAlloc memory; the first call moves the
// allocation into shared memory.
func (d *Driver) IpcGetMemHandle(c cuda.Context, ptr cuda.DevicePtr) (cuda.IpcHandle, error) {
	const op = "cuIpcGetMemHandle"
	var h cuda.IpcHandle
	v, err := d.ctx(op, c)
	if err != nil {
		return h, err
	}
	defer v.mu.Unlock()
	a := v.exact(ptr)
	if a == nil || a.kind != kindSync {
		return h, errf(op, cuda.ErrorInvalidValue, "%#x is not the start of a cuMemAlloc allocation of device %d", uint64(ptr), v.index)
	}
	if a.shm == nil {
		f, err := newShmFile(op, magicMemFile, v.index, a.base)
		if err != nil {
			return h, err
		}
		m, err := f.place(op, a.size)
		if err != nil {
			_ = unix.Close(f.fd)
			return h, err
		}
		m.own = f
		if a.data != nil {
			copy(m.mem, a.data)
		}
		a.shm, a.data = m, nil
	}
	copy(h[:8], magicMem[:])
	binary.LittleEndian.PutUint32(h[8:], uint32(os.Getpid()))
	binary.LittleEndian.PutUint32(h[12:], uint32(a.shm.own.fd))
	binary.LittleEndian.PutUint64(h[16:], a.size)
	binary.LittleEndian.PutUint64(h[24:], uint64(a.shm.off))
	binary.LittleEndian.PutUint32(h[32:], uint32(v.index))
	binary.LittleEndian.PutUint64(h[40:], a.base)
	return h, nil
}

// IpcOpenMemHandle implements cuIpcOpenMemHandle_v2: another process's allocation, reached through
// /proc/<pid>/fd. A process cannot open its own handle (CUDA_ERROR_INVALID_CONTEXT, as the driver says).
func (d *Driver) IpcOpenMemHandle(c cuda.Context, h cuda.IpcHandle) (cuda.DevicePtr, error) {
	const op = "cuIpcOpenMemHandle_v2"
	v, err := d.ctx(op, c)
	if err != nil {
		return 0, err
	}
	defer v.mu.Unlock()
	if [8]byte(h[:8]) != magicMem {
		return 0, errf(op, cuda.ErrorInvalidValue, "not an IPC memory handle of the simulator")
	}
	pid := int(binary.LittleEndian.Uint32(h[8:]))
	fdNum := int(int32(binary.LittleEndian.Uint32(h[12:])))
	size := binary.LittleEndian.Uint64(h[16:])
	off := int64(binary.LittleEndian.Uint64(h[24:]))
	base := binary.LittleEndian.Uint64(h[40:])
	if pid == os.Getpid() {
		return 0, errf(op, cuda.ErrorInvalidContext, "a process cannot open its own IPC memory handle; use the pointer itself")
	}
	fd, oerr := unix.Open(fmt.Sprintf("/proc/%d/fd/%d", pid, fdNum), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if oerr != nil {
		return 0, errf(op, cuda.ErrorInvalidValue, "the allocation behind the handle is gone (process %d exited or freed it): %v", pid, oerr)
	}
	defer unix.Close(fd)
	magic, hpid, _, id, ok := readHeader(fd)
	if !ok || magic != magicMemFile || hpid != pid || id != base {
		return 0, errf(op, cuda.ErrorInvalidValue, "the allocation behind the handle is gone (process %d freed it)", pid)
	}
	return v.mapImport(op, fd, off, size, kindIpcOpened)
}

// IpcCloseMemHandle implements cuIpcCloseMemHandle.
func (d *Driver) IpcCloseMemHandle(c cuda.Context, ptr cuda.DevicePtr) error {
	const op = "cuIpcCloseMemHandle"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	a := v.exact(ptr)
	if a == nil || a.kind != kindIpcOpened {
		return errf(op, cuda.ErrorInvalidValue, "%#x is not memory opened with cuIpcOpenMemHandle on device %d", uint64(ptr), v.index)
	}
	v.release(a)
	return nil
}

// ---- events ---------------------------------------------------------------------------------------------

// IpcGetEventHandle implements cuIpcGetEventHandle for events made with CU_EVENT_INTERPROCESS.
func (d *Driver) IpcGetEventHandle(c cuda.Context, eh cuda.Event) (cuda.IpcHandle, error) {
	const op = "cuIpcGetEventHandle"
	var h cuda.IpcHandle
	v, e, err := d.event(op, c, eh)
	if err != nil {
		return h, err
	}
	defer v.mu.Unlock()
	if e.flags&cuda.EventInterprocess == 0 {
		return h, errf(op, cuda.ErrorInvalidValue, "event %#x was not created with CU_EVENT_INTERPROCESS", uint64(eh))
	}
	copy(h[:8], magicEvent[:])
	binary.LittleEndian.PutUint32(h[8:], uint32(os.Getpid()))
	binary.LittleEndian.PutUint32(h[12:], uint32(v.index))
	binary.LittleEndian.PutUint64(h[16:], uint64(eh))
	return h, nil
}

// IpcOpenEventHandle implements cuIpcOpenEventHandle. Work in the simulator is done when it is enqueued,
// in the exporter too, so the opened event is complete.
func (d *Driver) IpcOpenEventHandle(c cuda.Context, h cuda.IpcHandle) (cuda.Event, error) {
	const op = "cuIpcOpenEventHandle"
	v, err := d.ctx(op, c)
	if err != nil {
		return 0, err
	}
	defer v.mu.Unlock()
	if [8]byte(h[:8]) != magicEvent {
		return 0, errf(op, cuda.ErrorInvalidValue, "not an IPC event handle of the simulator")
	}
	pid := int(binary.LittleEndian.Uint32(h[8:]))
	if pid == os.Getpid() {
		return 0, errf(op, cuda.ErrorInvalidContext, "a process cannot open its own IPC event handle; use the event itself")
	}
	if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
		return 0, errf(op, cuda.ErrorInvalidValue, "the process %d that exported the event has exited", pid)
	}
	ev := cuda.Event(v.handle(kindEventHandle))
	v.events[ev] = &event{flags: cuda.EventInterprocess | cuda.EventDisableTiming, recorded: true}
	return ev, nil
}

// waitForeignEvent is cuStreamWaitEvent with an event of another device than the stream's, which the
// driver allows. The event's device is checked first and unlocked before the stream's is locked, so no
// two device locks are held at once. Work is synchronous, so a recorded event is complete.
func (d *Driver) waitForeignEvent(op string, c cuda.Context, sh cuda.Stream, owner *device, eh cuda.Event) error {
	owner.mu.Lock()
	e := owner.events[eh]
	var captured *capture
	if e != nil {
		captured = e.capturedIn
	}
	owner.mu.Unlock()
	if e == nil {
		if err := d.enter(op); err != nil {
			return err
		}
		return errf(op, cuda.ErrorInvalidHandle, "event %#x is not a live event of device %d", uint64(eh), owner.index)
	}
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	if _, err := d.streamOp(op, v, sh); err != nil {
		return err
	}
	if captured != nil {
		return errf(op, cuda.ErrorCapturedEvent, "the event was last recorded in a stream capture on device %d", owner.index)
	}
	return nil
}

func (f *shmFile) close() {
	if f != nil && f.fd >= 0 {
		_ = unix.Close(f.fd)
		f.fd = -1
	}
}

// releaseShared unmaps the shared memory of a context being destroyed: its allocations' mappings, its
// pools' cached blocks and files.
func (v *device) releaseShared() {
	for _, a := range v.live {
		a.shm.unmap()
		a.shm = nil
	}
	for _, p := range v.pools {
		for _, a := range p.cache {
			a.shm.unmap()
			a.shm = nil
		}
		p.shared.close()
	}
}
