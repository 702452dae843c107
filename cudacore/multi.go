package cudacore

import (
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/cudacore/cudacore/cudacore/internal/process"
	"github.com/cudacore/cudacore/pkg/cuda"
)

// Several devices and several processes: peer access and copies, shareable memory exported to and
// imported from other processes, and events shared between processes. 64-byte handles cross as hex text
// (these are cold calls), file descriptors as ints.

func twoDevices(a, b int) (*process.Device, *process.Device, error) {
	da, err := process.GetDevice(a)
	if err != nil {
		return nil, nil, err
	}
	db, err := process.GetDevice(b)
	return da, db, err
}

func parseHandle(op, text string) (cuda.IpcHandle, error) {
	var h cuda.IpcHandle
	b, err := hex.DecodeString(text)
	if err != nil || len(b) != len(h) {
		return h, cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf(
			"an IPC handle is %d bytes as %d hex digits, got %q", len(h), 2*len(h), text))
	}
	copy(h[:], b)
	return h, nil
}

func checkKind(op, kind string) error {
	if kind != process.KindPool && kind != process.KindIPC {
		return cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf("unknown kind of shared memory %q: want %q or %q", kind, process.KindPool, process.KindIPC))
	}
	return nil
}

// CanAccessPeer says whether the device at ordinal can access peer's memory directly (opening both).
//
//cudacore:gil release
func CanAccessPeer(ordinal, peer int) (bool, error) {
	return guard("cudacore.can_access_peer", func() (bool, error) {
		if ordinal == peer {
			return false, nil
		}
		a, b, err := twoDevices(ordinal, peer)
		if err != nil {
			return false, err
		}
		return a.CanAccessPeer(b)
	})
}

// LinkProbe returns, as a JSON object, the path from the device at ordinal to peer: the driver's
// peer-to-peer attributes and what NVML says of the link (process.Link). It opens neither device and is
// safe while a stream captures.
//
//cudacore:gil release
func LinkProbe(ordinal, peer int) (string, error) {
	return guard("cudacore.link_probe", func() (string, error) {
		l, err := process.LinkBetween(ordinal, peer)
		if err != nil {
			return "", err
		}
		b, err := json.Marshal(l)
		return string(b), err
	})
}

// NCCLMemoryProbe returns, as a JSON object, what NCCL asks of the memory at ptr on the device at ordinal
// before it registers it with a peer process (process.NCCLMemory).
//
//cudacore:gil hold
func NCCLMemoryProbe(ordinal, ptr int) (string, error) {
	return guard("cudacore.nccl_memory_probe", func() (string, error) {
		d, err := process.GetDevice(ordinal)
		if err != nil {
			return "", err
		}
		m, err := d.ProbeNCCLMemory(cuda.DevicePtr(ptr))
		if err != nil {
			return "", err
		}
		b, err := json.Marshal(m)
		return string(b), err
	})
}

// EnablePeerAccess lets the device at ordinal access peer's memory, its pools included; it returns 0.
//
//cudacore:gil release
func EnablePeerAccess(ordinal, peer int) (int, error) {
	return guard("cudacore.enable_peer_access", func() (int, error) {
		a, b, err := twoDevices(ordinal, peer)
		if err != nil {
			return 0, err
		}
		return 0, a.EnablePeerAccess(b)
	})
}

func copyPeer(streamOrdinal, dstOrdinal, dst, srcOrdinal, src, n, stream int) (int, error) {
	const op = "cudacore.copy_peer"
	if n < 0 {
		return 0, cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf("the copy size must be >= 0 bytes, got %d", n))
	}
	dd, err := process.Lookup(dstOrdinal)
	if err != nil {
		return 0, err
	}
	sd, err := process.Lookup(srcOrdinal)
	if err != nil {
		return 0, err
	}
	m, s, err := copyStream(op, streamOrdinal, stream)
	if err != nil {
		return 0, err
	}
	dp, err := devPtr(op, dst)
	if err != nil {
		return 0, err
	}
	sp, err := devPtr(op, src)
	if err != nil {
		return 0, err
	}
	// The stream's Manager checks its own device's side for graph memory no launch made real; the other
	// device's Manager checks the other side.
	for _, side := range []struct {
		d *process.Device
		p cuda.DevicePtr
	}{{dd, dp}, {sd, sp}} {
		if side.d.Ordinal() != streamOrdinal {
			if err := side.d.Streams().CheckForeignUse("copy_peer", side.p, uint64(n)); err != nil {
				return 0, err
			}
		}
	}
	return n, m.CopyPeer(dp, dd, sp, sd, uint64(n), s)
}

// CopyPeer copies n bytes from src on device srcOrdinal to dst on device dstOrdinal, on a stream of device
// streamOrdinal (one of the two), or synchronously with stream -1. It returns n.
//
//cudacore:gil release
//cudacore:door hot
func CopyPeer(streamOrdinal, dstOrdinal, dst, srcOrdinal, src, n, stream int) (int, error) {
	return guard("cudacore.copy_peer", func() (int, error) {
		return copyPeer(streamOrdinal, dstOrdinal, dst, srcOrdinal, src, n, stream)
	})
}

// CopyPeerHeld is CopyPeer keeping the GIL, for asynchronous copies (they only enqueue).
//
//cudacore:gil hold
//cudacore:door hot
func CopyPeerHeld(streamOrdinal, dstOrdinal, dst, srcOrdinal, src, n, stream int) (int, error) {
	return guard("cudacore.copy_peer", func() (int, error) {
		return copyPeer(streamOrdinal, dstOrdinal, dst, srcOrdinal, src, n, stream)
	})
}

// ShareKind says how the device at ordinal shares memory: "pool" (an exportable pool, POSIX file
// descriptors) or "ipc" (cuMemAlloc and cuIpc handles).
//
//cudacore:gil release
func ShareKind(ordinal int) (string, error) {
	return guard("cudacore.allocate_shareable", func() (string, error) {
		d, err := process.GetDevice(ordinal)
		if err != nil {
			return "", err
		}
		return d.ShareKind(), nil
	})
}

// ShareAllocate allocates size bytes of memory another process can open, ordered on stream, and returns
// its address. kind is "pool", "ipc", or "" for the device's (ShareKind). The allocation is recorded
// under owner, its Python owner's token (process.Own), before the call returns: free it with
// OwnedFree(owner), which waits for the live graphs that use it.
//
//cudacore:gil release
func ShareAllocate(ordinal, size, stream int, kind string, owner int) (int, error) {
	return guard("cudacore.allocate_shareable", func() (int, error) {
		const op = "cudacore.allocate_shareable"
		if size <= 0 {
			return 0, cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf("size must be a positive number of bytes, got %d", size))
		}
		d, err := process.GetDevice(ordinal)
		if err != nil {
			return 0, err
		}
		if kind == "" {
			kind = d.ShareKind()
		}
		h := cuda.Stream(uint64(stream))
		p, err := d.ShareAllocate(uint64(size), h, kind)
		if err == nil {
			process.Own(uint64(owner), d, p, uint64(size), process.OwnedShared, func() error {
				return d.ShareFreeHeld(p, uint64(size), kind, h)
			})
		}
		return int(p), err
	})
}

// ShareFree frees memory of ShareAllocate (kind as ShareKind said), ordered on stream; it returns 0.
//
//cudacore:gil release
func ShareFree(ordinal, ptr int, kind string, stream int) (int, error) {
	return guard("cudacore.free_shareable", func() (int, error) {
		const op = "cudacore.free_shareable"
		if err := checkKind(op, kind); err != nil {
			return 0, err
		}
		d, err := process.GetDevice(ordinal)
		if err != nil {
			return 0, err
		}
		return 0, d.ShareFree(cuda.DevicePtr(uint64(ptr)), kind, cuda.Stream(uint64(stream)))
	})
}

type exportJSON struct {
	process.Export
	Handle string `json:"handle"`
}

// ShareExport exports memory of ShareAllocate as a JSON object: kind, handle (hex), fd (a new pool
// descriptor the caller owns, or -1) and pool_id.
//
//cudacore:gil release
func ShareExport(ordinal, ptr int, kind string) (string, error) {
	return guard("cudacore.export", func() (string, error) {
		const op = "cudacore.export"
		if err := checkKind(op, kind); err != nil {
			return "", err
		}
		d, err := process.GetDevice(ordinal)
		if err != nil {
			return "", err
		}
		e, err := d.ShareExport(cuda.DevicePtr(uint64(ptr)), kind)
		if err != nil {
			return "", err
		}
		b, err := json.Marshal(exportJSON{e, hex.EncodeToString(e.Handle[:])})
		return string(b), err
	})
}

// ShareImport opens size bytes of memory another process exported on the device at ordinal and returns
// its address here. fd is the pool's descriptor (kind "pool"), which the caller keeps. The mapping is
// recorded under owner, its Python owner's token, before the call returns: close it with
// OwnedFree(owner) (or ShareClose by address, for an owner of token 0).
//
//cudacore:gil release
func ShareImport(ordinal int, kind, handle string, fd int, poolID string, size, owner int) (int, error) {
	return guard("cudacore.open_shared", func() (int, error) {
		const op = "cudacore.open_shared"
		if err := checkKind(op, kind); err != nil {
			return 0, err
		}
		h, err := parseHandle(op, handle)
		if err != nil {
			return 0, err
		}
		d, err := process.GetDevice(ordinal)
		if err != nil {
			return 0, err
		}
		p, err := d.ShareImport(kind, h, fd, poolID)
		if err == nil {
			process.Own(uint64(owner), d, p, uint64(max(size, 0)), process.OwnedImported, func() error {
				return d.ShareClose(p, kind)
			})
		}
		return int(p), err
	})
}

// ShareClose unmaps memory ShareImport opened; it returns 0.
//
//cudacore:gil release
func ShareClose(ordinal, ptr int, kind string) (int, error) {
	return guard("cudacore.close_shared", func() (int, error) {
		const op = "cudacore.close_shared"
		if err := checkKind(op, kind); err != nil {
			return 0, err
		}
		d, err := process.GetDevice(ordinal)
		if err != nil {
			return 0, err
		}
		return 0, d.ShareClose(cuda.DevicePtr(uint64(ptr)), kind)
	})
}

// EventCreateInterprocess creates an event other processes can open (it cannot time) and returns its
// handle.
//
//cudacore:gil hold
func EventCreateInterprocess(ordinal int) (int, error) {
	return guard("cudacore.create_event", func() (int, error) {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return 0, err
		}
		e, err := d.Streams().NewInterprocessEvent()
		if err != nil {
			return 0, err
		}
		return process.Events.Add(int(e.Handle()), e), nil
	})
}

// EventIpcHandle returns the IPC handle of an interprocess event, as hex.
//
//cudacore:gil hold
func EventIpcHandle(handle int) (string, error) {
	return guard("cudacore.ipc_event", func() (string, error) {
		const op = "cudacore.ipc_event"
		e, err := eventOf(op, handle)
		if err != nil {
			return "", err
		}
		h, err := e.IpcHandle()
		return hex.EncodeToString(h[:]), err
	})
}

// EventOpenIpc opens another process's event on the device at ordinal and returns its handle here.
//
//cudacore:gil release
func EventOpenIpc(ordinal int, handle string) (int, error) {
	return guard("cudacore.open_event", func() (int, error) {
		const op = "cudacore.open_event"
		h, err := parseHandle(op, handle)
		if err != nil {
			return 0, err
		}
		d, err := process.GetDevice(ordinal)
		if err != nil {
			return 0, err
		}
		e, err := d.Streams().OpenEvent(h)
		if err != nil {
			return 0, err
		}
		return process.Events.Add(int(e.Handle()), e), nil
	})
}

// IpcProbe tries, on the device at ordinal, each way of sharing with other processes, and returns a JSON
// object of "posix_fd" (exportable pools), "cuipc_mem" (cuIpcGetMemHandle) and "cuipc_event"
// (cuIpcGetEventHandle), each "ok" or the error's text. It exports only: a process cannot open its own
// handles.
//
//cudacore:gil release
func IpcProbe(ordinal int) (string, error) {
	return guard("cudacore.ipc_probe", func() (string, error) {
		// Refused before the device is opened, as well as inside probeJSON: opening a device for the first
		// time makes calls of its own (its context, its pools), which a capture on another device may not
		// survive.
		if process.Capturing() {
			return "", probeRefusal("cudacore.ipc_probe")
		}
		d, err := process.GetDevice(ordinal)
		if err != nil {
			return "", err
		}
		return probeJSON("cudacore.ipc_probe", func() any { return process.ProbeIPC(d) })
	})
}

// probeJSON runs probe, a probe of a device (cudacore doctor's), and returns its result as JSON. Probes
// allocate and free memory (unsafe calls), so they are refused while a stream captures, and run while no
// capture can begin (Steady: the caller runs without the GIL), rather than invalidate a capture.
func probeJSON(op string, probe func() any) (out string, err error) {
	err = process.Steady(func() error {
		if process.Capturing() {
			return probeRefusal(op)
		}
		b, err := json.Marshal(probe())
		out = string(b)
		return err
	})
	return out, err
}

func probeRefusal(op string) error {
	return cuda.NewError(op, cuda.ErrorStreamCaptureUnsupported,
		"the probes allocate and free memory, which would invalidate the stream capture in progress; probe before or after the capture")
}

// ShareRelease gives the memory that the device's exportable pool keeps for reuse back to the device (call
// it after a synchronize, as MemoryRelease does one: blocks whose free the stream has not reached stay). It
// returns 0.
//
//cudacore:gil release
func ShareRelease(ordinal int) (int, error) {
	return guard("cudacore.release", func() (int, error) {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return 0, err
		}
		return 0, d.ShareRelease()
	})
}

// OwnedFree frees what the calls that named owner (a Python owner's token) recorded for it and that is
// still its own: shareable memory, mappings of another process's memory, and what an allocation made
// for a Buffer before the Buffer held it. A token freed already, or never given anything, frees
// nothing, so the owner may call it again after an interruption. It returns 0.
//
//cudacore:gil release
func OwnedFree(owner int) (int, error) {
	return guard("cudacore.free", func() (int, error) {
		return 0, process.FreeToken(uint64(owner))
	})
}

// OwnedClaim forgets what the calls that named owner recorded, without freeing it: the Buffers made for
// it own it now, and free it by address. It returns 0.
//
//cudacore:gil hold
func OwnedClaim(owner int) (int, error) {
	return guard("cudacore.free", func() (int, error) {
		process.Disown(uint64(owner))
		return 0, nil
	})
}
