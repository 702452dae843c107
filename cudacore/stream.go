package cudacore

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/cudacore/cudacore/cudacore/internal/kernels"
	"github.com/cudacore/cudacore/cudacore/internal/process"
	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/stream"
)

// Streams and events cross to Python as ints: a stream or event is named by its driver handle (so that
// Python can pass a stream's handle to the allocation fast path as it is), a graph by a number of ours.
// Each lives in a registry from creation until destroy, which removes it; an int that is not there is an
// InvalidHandle error, never a stale handle passed to the driver.
//
// Stream arguments are (ordinal, handle): handle 0 or 1 is the legacy default stream of that device, 2
// its per-thread default stream, anything else a stream from StreamCreate (which must belong to that
// device). Copy functions take -1 for "synchronous".

// streamOf resolves a stream argument.
func streamOf(op string, ordinal, handle int) (*process.Device, *stream.Stream, error) {
	d, err := process.Lookup(ordinal)
	if err != nil {
		return nil, nil, err
	}
	switch handle {
	case 0, int(cuda.StreamLegacy):
		return d, d.Streams().Legacy(), nil
	case int(cuda.StreamPerThread):
		return d, d.Streams().PerThread(), nil
	}
	s, ok := process.Streams.Get(handle)
	if !ok {
		if d.Streams().Closed(cuda.Stream(uint64(handle))) {
			return nil, nil, cuda.NewError(op, cuda.ErrorClosed, fmt.Sprintf(
				"stream %#x was closed; use a live stream", handle))
		}
		return nil, nil, cuda.NewError(op, cuda.ErrorInvalidHandle, fmt.Sprintf(
			"stream %#x is not a live cudacore stream (made elsewhere, or never a stream)", handle))
	}
	if s.Manager() != d.Streams() {
		return nil, nil, cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf(
			"%s belongs to device %d, not device %d; use a stream of the buffer's device", s, s.Manager().Device().Ordinal(), ordinal))
	}
	return d, s, nil
}

func eventOf(op string, handle int) (*stream.Event, error) {
	e, ok := process.Events.Get(handle)
	if !ok {
		return nil, cuda.NewError(op, cuda.ErrorInvalidHandle, fmt.Sprintf(
			"event %#x is not a live cudacore event (destroyed, or made elsewhere)", handle))
	}
	return e, nil
}

func millis(ms int) time.Duration {
	return time.Duration(min(max(ms, 0), 60_000)) * time.Millisecond
}

// StreamCreate creates a stream on the device and returns its driver handle. priority is clamped to the
// device's range (lower is greater; StreamPriorityRange).
//
//cudacore:gil hold
func StreamCreate(ordinal int, nonBlocking bool, priority int) (int, error) {
	return guard("cudacore.create_stream", func() (int, error) {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return 0, err
		}
		s, err := d.Streams().Create(nonBlocking, priority)
		if err != nil {
			return 0, err
		}
		return process.Streams.Add(int(s.Handle()), s), nil
	})
}

// StreamWatch records that the caller vouches for handle, a stream cudacore did not create, until
// StreamGone(handle): frees of blocks allocated on it meanwhile are ordered on it (process.WatchStream).
// The caller calls it while the stream is alive. It returns the watch's generation, 0 for a default
// stream or one of cudacore's own, which need no watcher.
//
//cudacore:gil hold
func StreamWatch(handle int) (int, error) {
	return guard("cudacore.watch_stream", func() (int, error) {
		if handle < 0 {
			return 0, cuda.NewError("cudacore.watch_stream", cuda.ErrorInvalidValue, fmt.Sprintf("a stream handle is >= 0, got %d", handle))
		}
		return int(process.WatchStream(cuda.Stream(uint64(handle)))), nil
	})
}

// StreamGone ends the watch of handle (StreamWatch): its owner destroyed it, or is about to. Blocks
// allocated on it and freed later wait for a device synchronize instead of reaching its handle. It says
// whether handle was watched.
//
//cudacore:gil hold
func StreamGone(handle int) (bool, error) {
	return guard("cudacore.stream_gone", func() (bool, error) {
		return process.StreamGone(cuda.Stream(uint64(handle))), nil
	})
}

// StreamPriorityRange returns the device's stream priorities as JSON [least, greatest].
//
//cudacore:gil hold
func StreamPriorityRange(ordinal int) (string, error) {
	return guard("cudacore.stream_priority_range", func() (string, error) {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return "", err
		}
		least, great, err := d.Streams().PriorityRange()
		return fmt.Sprintf("[%d, %d]", least, great), err
	})
}

// StreamInfo returns JSON {non_blocking, priority, capturing, mode}.
//
//cudacore:gil hold
func StreamInfo(ordinal, handle int) (string, error) {
	return guard("cudacore.stream_info", func() (string, error) {
		_, s, err := streamOf("cudacore.stream_info", ordinal, handle)
		if err != nil {
			return "", err
		}
		mode, capturing := s.CaptureMode()
		info := map[string]any{"non_blocking": s.NonBlocking(), "priority": s.Priority(), "capturing": capturing, "mode": nil}
		if capturing {
			info["mode"] = stream.ModeName(mode)
		}
		b, err := json.Marshal(info)
		return string(b), err
	})
}

// StreamDestroy ends a capture in progress on the stream (discarding it), gives its cached memory back
// and destroys it; it returns 0. Destroying a stream already destroyed does nothing.
//
//cudacore:gil hold
func StreamDestroy(ordinal, handle int) (int, error) {
	return guard("cudacore.destroy_stream", func() (int, error) {
		if _, err := process.Lookup(ordinal); err != nil {
			return 0, err
		}
		s, ok := process.Streams.Remove(handle)
		if !ok {
			return 0, nil
		}
		return 0, s.Destroy()
	})
}

// StreamQuery says whether the stream has finished its work.
//
//cudacore:gil hold
//cudacore:door hot
func StreamQuery(ordinal, handle int) (bool, error) {
	return guard("cudacore.query", func() (bool, error) {
		_, s, err := streamOf("cudacore.query", ordinal, handle)
		if err != nil {
			return false, err
		}
		return s.Query()
	})
}

// StreamWait waits at most timeoutMs milliseconds (up to 60 s) for the stream and says whether it is
// done. Python's Stream.synchronize calls it in short slices so that Ctrl-C is seen between them.
//
//cudacore:gil release
//cudacore:door hot
func StreamWait(ordinal, handle, timeoutMs int) (bool, error) {
	return guard("cudacore.synchronize", func() (bool, error) {
		_, s, err := streamOf("cudacore.synchronize", ordinal, handle)
		if err != nil {
			return false, err
		}
		return s.Wait(millis(timeoutMs))
	})
}

// StreamSynchronize waits for the stream without a time limit (cuStreamSynchronize) and returns true.
//
//cudacore:gil release
//cudacore:door hot
func StreamSynchronize(ordinal, handle int) (bool, error) {
	return guard("cudacore.synchronize", func() (bool, error) {
		_, s, err := streamOf("cudacore.synchronize", ordinal, handle)
		if err != nil {
			return false, err
		}
		return true, s.Synchronize()
	})
}

// StreamWaitEvent makes later work on the stream wait for the event; it returns 0.
//
//cudacore:gil hold
//cudacore:door hot
func StreamWaitEvent(ordinal, handle, event int) (int, error) {
	return guard("cudacore.wait_event", func() (int, error) {
		_, s, err := streamOf("cudacore.wait_event", ordinal, handle)
		if err != nil {
			return 0, err
		}
		e, err := eventOf("cudacore.wait_event", event)
		if err != nil {
			return 0, err
		}
		return 0, s.WaitEvent(e)
	})
}

// StreamBeginCapture starts capturing the stream in mode "thread_local", "global" or "relaxed"; it
// returns 0.
//
//cudacore:gil hold
func StreamBeginCapture(ordinal, handle int, mode string) (int, error) {
	return guard("cudacore.begin_capture", func() (int, error) {
		m, err := stream.ParseMode(mode)
		if err != nil {
			return 0, err
		}
		_, s, err := streamOf("cudacore.begin_capture", ordinal, handle)
		if err != nil {
			return 0, err
		}
		return 0, s.BeginCapture(m)
	})
}

// StreamEndCapture ends the stream's capture and returns a graph handle (not yet instantiated: see
// GraphInstantiate). A capture that cudacore ended itself after a failure returns that CaptureError.
//
//cudacore:gil hold
func StreamEndCapture(ordinal, handle int) (int, error) {
	return guard("cudacore.end_capture", func() (int, error) {
		_, s, err := streamOf("cudacore.end_capture", ordinal, handle)
		if err != nil {
			return 0, err
		}
		g, err := s.EndCapture()
		if err != nil {
			return 0, err
		}
		return process.Graphs.Add(0, g), nil
	})
}

// StreamAbortCapture ends the stream's capture, if any, discarding it and any pending failure; it
// returns 0. It is refused, and the capture goes on, on a thread other than the one that began a GLOBAL
// or THREAD_LOCAL capture, and on a stream joined to another stream's capture.
//
//cudacore:gil hold
func StreamAbortCapture(ordinal, handle int) (int, error) {
	return guard("cudacore.abort_capture", func() (int, error) {
		_, s, err := streamOf("cudacore.abort_capture", ordinal, handle)
		if err != nil {
			return 0, err
		}
		return 0, s.AbortCapture()
	})
}

// DeviceSynchronize waits at most timeoutMs milliseconds (0: no limit) for all work of the device and
// says whether it is done; a wait that timed out goes on in the background and the next call picks it up.
// fresh says the call begins a new wait (the first slice of Device.synchronize): a synchronize still in
// flight from an earlier, abandoned wait covers only the work queued before it, so another follows it.
//
//cudacore:gil release
func DeviceSynchronize(ordinal, timeoutMs int, fresh bool) (bool, error) {
	return guard("cudacore.device_synchronize", func() (bool, error) {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return false, err
		}
		return d.Streams().SynchronizeDevice(millis(timeoutMs), fresh)
	})
}

// EventCreate creates an event on the device and returns its handle; timing events can measure elapsed
// time.
//
//cudacore:gil hold
func EventCreate(ordinal int, timing bool) (int, error) {
	return guard("cudacore.create_event", func() (int, error) {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return 0, err
		}
		e, err := d.Streams().NewEvent(timing)
		if err != nil {
			return 0, err
		}
		return process.Events.Add(int(e.Handle()), e), nil
	})
}

// EventDestroy destroys the event (doing nothing if it is gone already); it returns 0.
//
//cudacore:gil hold
func EventDestroy(handle int) (int, error) {
	return guard("cudacore.destroy_event", func() (int, error) {
		e, ok := process.Events.Remove(handle)
		if !ok {
			return 0, nil
		}
		return 0, e.Destroy()
	})
}

// EventRecord records the event on a stream of its device; it returns 0.
//
//cudacore:gil hold
//cudacore:door hot
func EventRecord(handle, ordinal, streamHandle int) (int, error) {
	return guard("cudacore.event_record", func() (int, error) {
		e, err := eventOf("cudacore.event_record", handle)
		if err != nil {
			return 0, err
		}
		_, s, err := streamOf("cudacore.event_record", ordinal, streamHandle)
		if err != nil {
			return 0, err
		}
		return 0, e.Record(s)
	})
}

// EventQuery says whether the work the event recorded has finished.
//
//cudacore:gil hold
//cudacore:door hot
func EventQuery(handle int) (bool, error) {
	return guard("cudacore.event_query", func() (bool, error) {
		e, err := eventOf("cudacore.event_query", handle)
		if err != nil {
			return false, err
		}
		return e.Query()
	})
}

// EventWait waits at most timeoutMs milliseconds for the event and says whether it has completed.
//
//cudacore:gil release
//cudacore:door hot
func EventWait(handle, timeoutMs int) (bool, error) {
	return guard("cudacore.event_synchronize", func() (bool, error) {
		e, err := eventOf("cudacore.event_synchronize", handle)
		if err != nil {
			return false, err
		}
		return e.Wait(millis(timeoutMs))
	})
}

// EventElapsed returns the milliseconds from start's completion to end's.
//
//cudacore:gil hold
func EventElapsed(start, end int) (float64, error) {
	return guard("cudacore.event_elapsed_time", func() (float64, error) {
		a, err := eventOf("cudacore.event_elapsed_time", start)
		if err != nil {
			return 0, err
		}
		b, err := eventOf("cudacore.event_elapsed_time", end)
		if err != nil {
			return 0, err
		}
		ms, err := b.ElapsedTime(a)
		return float64(ms), err
	})
}

// StreamObjects returns JSON {streams, events, graphs, captures, modules}: how many of each are alive
// (leak checks).
//
//cudacore:gil hold
func StreamObjects() (string, error) {
	return guard("cudacore.stream_objects", func() (string, error) {
		modules, _ := kernels.Default.Len()
		b, err := json.Marshal(map[string]int{"streams": process.Streams.Len(), "events": process.Events.Len(), "graphs": process.Graphs.Len(),
			"captures": process.ActiveCaptures(), "modules": modules})
		return string(b), err
	})
}
