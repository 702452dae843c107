package stream

import (
	"fmt"

	"github.com/cudacore/cudacore/pkg/cuda"
)

const (
	opCopyPeer = "copy_peer"
	opIpcEvent = "ipc_event"
)

// Peer is the other device of a peer copy: its context, for cuMemcpyPeerAsync.
type Peer interface {
	Context() cuda.Context
	Ordinal() int
}

// CopyPeer copies n bytes from src on device srcDev to dst on device dstDev (cuMemcpyPeerAsync), ordered on
// s, a stream of m's device (which must be one of the two), or synchronously when s is nil: then it is
// enqueued on m's legacy stream and waited for, under the same capture rules as a synchronous copy.
func (m *Manager) CopyPeer(dst cuda.DevicePtr, dstDev Peer, src cuda.DevicePtr, srcDev Peer, n uint64, s *Stream) error {
	if own := m.dev.Ordinal(); own != dstDev.Ordinal() && own != srcDev.Ordinal() {
		return cuda.NewError("cudacore."+opCopyPeer, cuda.ErrorInvalidValue, fmt.Sprintf(
			"the copy is from device %d to device %d but the stream belongs to device %d; use a stream of either",
			srcDev.Ordinal(), dstDev.Ordinal(), own))
	}
	// m's books hold the graph memory of m's device only: the side of the copy on it is checked here, the
	// other device's side by its own Manager (CheckForeignUse, called by the caller, which has it).
	own := m.dev.Ordinal()
	if own == dstDev.Ordinal() {
		if err := m.checkPendingUse(opCopyPeer, s, span{dst, dst + cuda.DevicePtr(n)}); err != nil {
			return err
		}
	}
	if own == srcDev.Ordinal() {
		if err := m.checkPendingUse(opCopyPeer, s, span{src, src + cuda.DevicePtr(n)}); err != nil {
			return err
		}
	}
	if s == nil {
		return m.syncPeerCopy(dst, dstDev, src, srcDev, n)
	}
	if err := m.checkStreamArg(opCopyPeer, s); err != nil || n == 0 {
		return err
	}
	return m.after(opCopyPeer, s, s.hold(opCopyPeer, func() error {
		return m.drv.MemcpyPeerAsync(m.ctx, dst, dstDev.Context(), src, srcDev.Context(), n, s.h)
	}))
}

// syncPeerCopy is CopyPeer without a stream: the copy is enqueued on m's legacy stream and waited for with
// cuStreamSynchronize. So it is refused where a synchronous copy is (a blocking stream of m's device
// captures: 906) and also where a capture forbids unsafe calls on this thread (a GLOBAL capture anywhere, a
// THREAD_LOCAL one of this thread: the synchronize is one, the driver's 900, which would end that capture).
// The checks and the driver's calls run in one steady state, so no capture begins between them (the door
// runs without the GIL); after, which may end captures, runs outside it.
func (m *Manager) syncPeerCopy(dst cuda.DevicePtr, dstDev Peer, src cuda.DevicePtr, srcDev Peer, n uint64) error {
	const fix = "pass the capturing stream (stream=<the capturing stream>), or copy before or after the capture"
	var err error
	if serr := m.reg.Steady(func() error {
		if err := m.checkSyncCopy(opCopyPeer, "a synchronous peer copy", fix); err != nil {
			return err
		}
		if err := m.CheckUnsafe(opCopyPeer,
			"a synchronous peer copy (it waits for the legacy stream: cuStreamSynchronize)", fix); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		err = m.drv.MemcpyPeerAsync(m.ctx, dst, dstDev.Context(), src, srcDev.Context(), n, cuda.StreamLegacy)
		if err == nil {
			err = m.drv.StreamSynchronize(m.ctx, cuda.StreamLegacy)
		}
		return nil
	}); serr != nil || n == 0 {
		return serr
	}
	return m.after(opCopyPeer, nil, err)
}

// NewInterprocessEvent creates an event that other processes can open (IpcHandle, OpenEvent). Such
// events cannot time (the driver requires CU_EVENT_DISABLE_TIMING with CU_EVENT_INTERPROCESS).
func (m *Manager) NewInterprocessEvent() (*Event, error) {
	h, err := m.drv.EventCreate(m.ctx, cuda.EventInterprocess|cuda.EventDisableTiming)
	if err != nil {
		return nil, err
	}
	return &Event{m: m, h: h, interprocess: true}, nil
}

// Interprocess says whether other processes can open the event.
func (e *Event) Interprocess() bool { return e.interprocess }

// IpcHandle returns the handle another process opens the event with (cuIpcGetEventHandle).
func (e *Event) IpcHandle() (cuda.IpcHandle, error) {
	var h cuda.IpcHandle
	if !e.interprocess {
		return h, cuda.NewError("cudacore."+opIpcEvent, cuda.ErrorInvalidValue, fmt.Sprintf(
			"%s was not created for sharing between processes; create it with interprocess=True", e))
	}
	err := e.hold(opIpcEvent, func() error {
		var err error
		h, err = e.m.drv.IpcGetEventHandle(e.m.ctx, e.h)
		return err
	})
	return h, err
}

// OpenEvent opens an event of another process (cuIpcOpenEventHandle). Streams of this process can wait
// on it and the host can query or synchronize it; recording it stays the exporter's business, so the
// event counts as recorded.
func (m *Manager) OpenEvent(h cuda.IpcHandle) (*Event, error) {
	eh, err := m.drv.IpcOpenEventHandle(m.ctx, h)
	if err != nil {
		return nil, err
	}
	return &Event{m: m, h: eh, interprocess: true, recorded: true}, nil
}
