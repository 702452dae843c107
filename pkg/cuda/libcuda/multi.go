package libcuda

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"unsafe"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// The cuda.MultiDriver methods: peer access, shared pools and IPC handles. A 64-byte handle crosses as a
// C array copied in and out in C, so no Go pointer is kept by C.

func handleBytes(h *cuda.IpcHandle) *C.uchar { return (*C.uchar)(unsafe.Pointer(&h[0])) }

// DeviceCanAccessPeer reports whether dev can access peer's memory (cuDeviceCanAccessPeer).
func (d *Driver) DeviceCanAccessPeer(dev, peer cuda.Device) (bool, error) {
	var can C.int
	if r := C.cc_deviceCanAccessPeer(d.tab, C.int(dev), C.int(peer), &can); r != 0 {
		return false, d.fail(symDeviceCanAccessPeer, r)
	}
	return can != 0, nil
}

// DeviceGetP2PAttribute reads one attribute of the path from src to dst (cuDeviceGetP2PAttribute).
func (d *Driver) DeviceGetP2PAttribute(attr cuda.P2PAttribute, src, dst cuda.Device) (int, error) {
	var v C.int
	if r := C.cc_deviceGetP2PAttribute(d.tab, C.int(attr), C.int(src), C.int(dst), &v); r != 0 {
		return 0, d.fail(symDeviceGetP2PAttribute, r)
	}
	return int(v), nil
}

// PointerGetAttribute reads an integer attribute of the allocation holding ptr (cuPointerGetAttribute).
func (d *Driver) PointerGetAttribute(ctx cuda.Context, attr cuda.PointerAttribute, ptr cuda.DevicePtr) (uint64, error) {
	var v C.ulonglong
	if r := C.cc_pointerGetAttribute(d.tab, cctx(ctx), C.int(attr), C.CUdeviceptr(ptr), &v); r != 0 {
		return 0, d.fail(symPointerGetAttribute, r)
	}
	return uint64(v), nil
}

// MemRetainAllocationHandle returns the physical allocation behind ptr (cuMemRetainAllocationHandle).
func (d *Driver) MemRetainAllocationHandle(ctx cuda.Context, ptr cuda.DevicePtr) (cuda.MemHandle, error) {
	if err := d.need(symMemRetainAllocationHandle); err != nil {
		return 0, err
	}
	var h C.ulonglong
	if r := C.cc_memRetainAllocationHandle(d.tab, cctx(ctx), C.CUdeviceptr(ptr), &h); r != 0 {
		return 0, d.fail(symMemRetainAllocationHandle, r)
	}
	return cuda.MemHandle(h), nil
}

// MemRelease gives back a reference to a physical allocation (cuMemRelease).
func (d *Driver) MemRelease(ctx cuda.Context, h cuda.MemHandle) error {
	if err := d.need(symMemRelease); err != nil {
		return err
	}
	if r := C.cc_memRelease(d.tab, cctx(ctx), C.ulonglong(h)); r != 0 {
		return d.fail(symMemRelease, r)
	}
	return nil
}

// CtxEnablePeerAccess lets ctx's device access memory of peer's device (cuCtxEnablePeerAccess).
func (d *Driver) CtxEnablePeerAccess(ctx, peer cuda.Context) error {
	if r := C.cc_ctxEnablePeerAccess(d.tab, cctx(ctx), cctx(peer)); r != 0 {
		return d.fail(symCtxEnablePeerAccess, r)
	}
	return nil
}

// MemcpyPeerAsync copies n bytes between devices, ordered on s of ctx (cuMemcpyPeerAsync).
func (d *Driver) MemcpyPeerAsync(ctx cuda.Context, dst cuda.DevicePtr, dstCtx cuda.Context, src cuda.DevicePtr, srcCtx cuda.Context, n uint64, s cuda.Stream) error {
	if r := C.cc_memcpyPeerAsync(d.tab, cctx(ctx), C.CUdeviceptr(dst), cctx(dstCtx), C.CUdeviceptr(src), cctx(srcCtx),
		C.ulonglong(n), cstream(s)); r != 0 {
		return d.fail(symMemcpyPeerAsync, r)
	}
	return nil
}

// MemPoolSetAccess sets what dev may do with pool's memory (cuMemPoolSetAccess).
func (d *Driver) MemPoolSetAccess(ctx cuda.Context, pool cuda.MemPool, dev cuda.Device, flags cuda.AccessFlags) error {
	if r := C.cc_memPoolSetAccess(d.tab, cctx(ctx), C.uintptr_t(pool), C.int(dev), C.int(flags)); r != 0 {
		return d.fail(symMemPoolSetAccess, r)
	}
	return nil
}

// MemPoolGetAccess reads what dev may do with pool's memory (cuMemPoolGetAccess).
func (d *Driver) MemPoolGetAccess(ctx cuda.Context, pool cuda.MemPool, dev cuda.Device) (cuda.AccessFlags, error) {
	var f C.int
	if r := C.cc_memPoolGetAccess(d.tab, cctx(ctx), C.uintptr_t(pool), C.int(dev), &f); r != 0 {
		return 0, d.fail(symMemPoolGetAccess, r)
	}
	return cuda.AccessFlags(f), nil
}

// MemPoolExportToShareableHandle exports pool as a file descriptor (cuMemPoolExportToShareableHandle).
func (d *Driver) MemPoolExportToShareableHandle(ctx cuda.Context, pool cuda.MemPool, ht cuda.HandleType) (int, error) {
	if ht != cuda.HandlePosixFD {
		return -1, cuda.NewError(d.op(symMemPoolExportToShareableHandle), cuda.ErrorNotSupported,
			"cudacore exports pools as POSIX file descriptors only")
	}
	fd := C.int(-1)
	if r := C.cc_memPoolExportToShareableHandle(d.tab, cctx(ctx), C.uintptr_t(pool), C.int(ht), &fd); r != 0 {
		return -1, d.fail(symMemPoolExportToShareableHandle, r)
	}
	return int(fd), nil
}

// MemPoolImportFromShareableHandle imports a pool from a file descriptor (cuMemPoolImportFromShareableHandle).
func (d *Driver) MemPoolImportFromShareableHandle(ctx cuda.Context, fd int, ht cuda.HandleType) (cuda.MemPool, error) {
	if ht != cuda.HandlePosixFD {
		return 0, cuda.NewError(d.op(symMemPoolImportFromShareableHandle), cuda.ErrorNotSupported,
			"cudacore imports pools from POSIX file descriptors only")
	}
	var p C.uintptr_t
	if r := C.cc_memPoolImportFromShareableHandle(d.tab, cctx(ctx), C.int(fd), C.int(ht), &p); r != 0 {
		return 0, d.fail(symMemPoolImportFromShareableHandle, r)
	}
	return cuda.MemPool(p), nil
}

// MemPoolExportPointer returns the export data of a pool allocation (cuMemPoolExportPointer).
func (d *Driver) MemPoolExportPointer(ctx cuda.Context, ptr cuda.DevicePtr) (cuda.IpcHandle, error) {
	var h cuda.IpcHandle
	if r := C.cc_memPoolExportPointer(d.tab, cctx(ctx), C.CUdeviceptr(ptr), handleBytes(&h)); r != 0 {
		return h, d.fail(symMemPoolExportPointer, r)
	}
	return h, nil
}

// MemPoolImportPointer maps an exported pool allocation (cuMemPoolImportPointer).
func (d *Driver) MemPoolImportPointer(ctx cuda.Context, pool cuda.MemPool, data cuda.IpcHandle) (cuda.DevicePtr, error) {
	var p C.CUdeviceptr
	if r := C.cc_memPoolImportPointer(d.tab, cctx(ctx), C.uintptr_t(pool), handleBytes(&data), &p); r != 0 {
		return 0, d.fail(symMemPoolImportPointer, r)
	}
	return cuda.DevicePtr(p), nil
}

// IpcGetMemHandle returns the IPC handle of a cuMemAlloc allocation (cuIpcGetMemHandle).
func (d *Driver) IpcGetMemHandle(ctx cuda.Context, ptr cuda.DevicePtr) (cuda.IpcHandle, error) {
	var h cuda.IpcHandle
	if r := C.cc_ipcGetMemHandle(d.tab, cctx(ctx), C.CUdeviceptr(ptr), handleBytes(&h)); r != 0 {
		return h, d.fail(symIpcGetMemHandle, r)
	}
	return h, nil
}

// IpcOpenMemHandle maps another process's allocation (cuIpcOpenMemHandle_v2, lazy peer access).
func (d *Driver) IpcOpenMemHandle(ctx cuda.Context, h cuda.IpcHandle) (cuda.DevicePtr, error) {
	var p C.CUdeviceptr
	if r := C.cc_ipcOpenMemHandle(d.tab, cctx(ctx), handleBytes(&h), C.uint(cuda.IpcLazyPeerAccess), &p); r != 0 {
		return 0, d.fail(symIpcOpenMemHandle, r)
	}
	return cuda.DevicePtr(p), nil
}

// IpcCloseMemHandle unmaps an opened allocation (cuIpcCloseMemHandle).
func (d *Driver) IpcCloseMemHandle(ctx cuda.Context, ptr cuda.DevicePtr) error {
	if r := C.cc_ipcCloseMemHandle(d.tab, cctx(ctx), C.CUdeviceptr(ptr)); r != 0 {
		return d.fail(symIpcCloseMemHandle, r)
	}
	return nil
}

// IpcGetEventHandle returns the IPC handle of an interprocess event (cuIpcGetEventHandle).
func (d *Driver) IpcGetEventHandle(ctx cuda.Context, e cuda.Event) (cuda.IpcHandle, error) {
	var h cuda.IpcHandle
	if r := C.cc_ipcGetEventHandle(d.tab, cctx(ctx), C.uintptr_t(e), handleBytes(&h)); r != 0 {
		return h, d.fail(symIpcGetEventHandle, r)
	}
	return h, nil
}

// IpcOpenEventHandle opens another process's event (cuIpcOpenEventHandle).
func (d *Driver) IpcOpenEventHandle(ctx cuda.Context, h cuda.IpcHandle) (cuda.Event, error) {
	var e C.uintptr_t
	if r := C.cc_ipcOpenEventHandle(d.tab, cctx(ctx), handleBytes(&h), &e); r != 0 {
		return 0, d.fail(symIpcOpenEventHandle, r)
	}
	return cuda.Event(e), nil
}
