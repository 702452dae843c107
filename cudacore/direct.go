package cudacore

import (
	"github.com/cudacore/cudacore/cudacore/internal/process"
	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
)

// The direct path of the hot calls.
//
// A graph launch or a small pinned copy that cudacore has already checked once costs a crossing into Go
// and back for checks that cannot fail while nothing changes. The direct path (cudacore/native/direct.c)
// makes such calls from C: on the real driver it calls the shim's cc_* functions with the driver's table;
// on the simulator it calls the SimDirect* doors below, which hand the call to the simulated driver with
// no check of cudacore's, as the real driver would take it. It is taken only while the Python layer
// knows that every check would pass (a stream the calling object owns and has not closed, no capture
// anywhere, an executable graph that GraphLaunch handed out), and any failure falls back to the full path
// through Go, which makes the call again and reports its error. Which way a device goes is one of its
// facts in the snapshot (package snapshot), which Go publishes when it opens the device.

// simDirect returns device ordinal's simulated driver and context, refusing any other driver: the
// SimDirect* doors exist only for the simulator's direct path.
func simDirect(op string, ordinal int) (*cudasim.Driver, cuda.Context, error) {
	d, err := process.Lookup(ordinal)
	if err != nil {
		return nil, 0, err
	}
	sim, ok := d.Driver().(*cudasim.Driver)
	if !ok {
		return nil, 0, cuda.NewError(op, cuda.ErrorNotSupported, "the direct path's simulator door needs the simulator")
	}
	return sim, d.Context(), nil
}

// SimDirectGraphLaunch is the simulator's cuGraphLaunch on the direct path: exec on the stream handle,
// with no check of cudacore's (a destroyed stream's handle ends the process, as on the real driver).
// It returns 0.
//
//cudacore:gil hold
//cudacore:door hot
func SimDirectGraphLaunch(ordinal, exec, streamHandle int) (int, error) {
	return guard("cudacore.sim_direct_graph_launch", func() (int, error) {
		sim, ctx, err := simDirect("cudacore.sim_direct_graph_launch", ordinal)
		if err != nil {
			return 0, err
		}
		return 0, sim.GraphLaunch(ctx, cuda.GraphExec(uint64(exec)), cuda.Stream(uint64(streamHandle)))
	})
}

// SimDirectCopyToDevice is the simulator's cuMemcpyHtoDAsync on the direct path: host to device address
// dst on the stream handle, with no check of cudacore's. It returns 0.
//
//cudacore:gil hold
//cudacore:door hot
func SimDirectCopyToDevice(ordinal, dst int, host []byte, streamHandle int) (int, error) {
	return guard("cudacore.sim_direct_copy_to_device", func() (int, error) {
		sim, ctx, err := simDirect("cudacore.sim_direct_copy_to_device", ordinal)
		if err != nil {
			return 0, err
		}
		return 0, sim.MemcpyHtoDAsync(ctx, cuda.DevicePtr(uint64(dst)), host, cuda.Stream(uint64(streamHandle)))
	})
}

// SimDirectCopyToHost is the simulator's cuMemcpyDtoHAsync on the direct path: device address src into
// host on the stream handle, with no check of cudacore's. It returns 0.
//
//cudacore:gil hold
//cudacore:door hot
//cudacore:writable host
func SimDirectCopyToHost(ordinal int, host []byte, src, streamHandle int) (int, error) {
	return guard("cudacore.sim_direct_copy_to_host", func() (int, error) {
		sim, ctx, err := simDirect("cudacore.sim_direct_copy_to_host", ordinal)
		if err != nil {
			return 0, err
		}
		return 0, sim.MemcpyDtoHAsync(ctx, host, cuda.DevicePtr(uint64(src)), cuda.Stream(uint64(streamHandle)))
	})
}

// simQueryAnswer is a simulated query's result on the direct path: 1 finished, 0 not yet, or the error.
func simQueryAnswer(err error) (int, error) {
	switch {
	case err == nil:
		return 1, nil
	case cuda.ResultOf(err) == cuda.ErrorNotReady:
		return 0, nil
	default:
		return 0, err
	}
}

// SimDirectStreamQuery is the simulator's cuStreamQuery on the direct path: 1 when the work queued on
// the stream handle has finished, 0 when it has not, with no check of cudacore's.
//
//cudacore:gil hold
//cudacore:door hot
func SimDirectStreamQuery(ordinal, streamHandle int) (int, error) {
	return guard("cudacore.sim_direct_stream_query", func() (int, error) {
		sim, ctx, err := simDirect("cudacore.sim_direct_stream_query", ordinal)
		if err != nil {
			return 0, err
		}
		return simQueryAnswer(sim.StreamQuery(ctx, cuda.Stream(uint64(streamHandle))))
	})
}

// SimDirectEventQuery is the simulator's cuEventQuery on the direct path: 1 when the work the event
// handle recorded has finished, 0 when it has not, with no check of cudacore's.
//
//cudacore:gil hold
//cudacore:door hot
func SimDirectEventQuery(ordinal, eventHandle int) (int, error) {
	return guard("cudacore.sim_direct_event_query", func() (int, error) {
		sim, ctx, err := simDirect("cudacore.sim_direct_event_query", ordinal)
		if err != nil {
			return 0, err
		}
		return simQueryAnswer(sim.EventQuery(ctx, cuda.Event(uint64(eventHandle))))
	})
}
