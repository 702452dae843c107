package stream

import (
	"github.com/cudacore/cudacore/pkg/cuda"
)

const opFill = "fill" // Buffer.fill: a memset of device memory

// Fill sets n bytes of device memory at dst to v (cuMemsetD8Async), on s, or with s nil synchronously:
// on the legacy stream, waited for before it returns (the driver interface has no synchronous memset,
// and the legacy stream orders the memset after the work of every blocking stream, as a synchronous copy
// is). The capture rules are a copy's: a synchronous fill is refused while a blocking stream captures
// (906) and where a capture forbids waiting on this thread (a "global" capture, or a "thread_local" one
// begun on this thread); on a capturing stream the fill is a memset node of the graph.
func (m *Manager) Fill(dst cuda.DevicePtr, v uint8, n uint64, s *Stream) error {
	if err := m.checkPendingUse(opFill, s, span{dst, dst + cuda.DevicePtr(n)}); err != nil {
		return err
	}
	if s == nil {
		var err error
		if serr := m.reg.Steady(func() error {
			if err := m.checkSyncCopy(opFill, "a synchronous fill",
				"fill on the capturing stream (fill(value, stream=<the capturing stream>)) instead"); err != nil || n == 0 {
				return err
			}
			if c := m.unsafeCapture(); c != nil {
				return CaptureError(cuda.ErrorStreamCaptureUnsupported, opFill, unsafeMsg(
					"a synchronous fill (which waits for the legacy stream)", c,
					"fill on a stream (fill(value, stream=s)), or before or after the capture"))
			}
			err = m.legacy.hold(opFill, func() error {
				if err := m.drv.MemsetD8Async(m.ctx, dst, v, n, cuda.StreamLegacy); err != nil {
					return err
				}
				return m.drv.StreamSynchronize(m.ctx, cuda.StreamLegacy)
			})
			return nil
		}); serr != nil || n == 0 {
			return serr
		}
		return m.after(opFill, nil, err)
	}
	if err := m.checkStreamArg(opFill, s); err != nil || n == 0 {
		return err
	}
	return m.after(opFill, s, s.hold(opFill, func() error {
		m.noteUse(s, dst, n)
		return m.drv.MemsetD8Async(m.ctx, dst, v, n, s.h)
	}))
}
