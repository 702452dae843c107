package memory

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/device"
)

// PoolState is what this process's allocator holds when an allocation fails, for the message.
type PoolState struct {
	InUse  uint64 // bytes handed out through the allocator
	Cached uint64 // bytes held for reuse (cache plus pool reserve)
	Limit  uint64 // the byte limit, 0 for none
}

// OutOfMemory builds the out-of-memory error users see for a failed allocation of requested bytes on d.
//
// Op is the entry point that failed, taken from cause (cuMemAllocFromPoolAsync, cuMemAlloc_v2, or
// LimitOp when a limit was hit). Fields: requested, free, total, device, in_use, cached, and limit when a
// limit is set (with limit_in_use when it was the limit that was hit). The message gives these for a person
// and ends with what to try, chosen by case:
//   - the request is larger than the device's total memory: split it or use managed memory (allocate_managed);
//   - a limit was hit: raise or remove it;
//   - cached memory was released and the retry still failed (cause went through Retry): say so;
//   - memory is cached but was not released (no Retry below): release it and retry;
//   - otherwise: free memory or allocate less; other processes may hold memory.
//
// free and total are read from the driver now (cuMemGetInfo); if that fails they fall back to 0 free and
// the total from d's properties.
func OutOfMemory(d *device.Device, requested uint64, cause error, ps PoolState) *cuda.Error {
	op := "cudacore.allocate"
	var ce *cuda.Error
	if errors.As(cause, &ce) && ce.Op != "" {
		op = ce.Op
	}
	limitHit := op == LimitOp
	var limitInUse uint64
	if limitHit {
		if v, ok := ce.Field("in_use"); ok {
			fmt.Sscan(v, &limitInUse)
		}
		if v, ok := ce.Field("limit"); ok && ps.Limit == 0 {
			fmt.Sscan(v, &ps.Limit)
		}
	}
	var released uint64
	var rt *retriedError
	retried := errors.As(cause, &rt)
	if retried {
		released = rt.released
	}

	props := d.Properties()
	free, total, err := d.MemoryInfo()
	if err != nil {
		free, total = 0, props.TotalMemory
	}
	name := strings.TrimSpace(props.Name)

	var b strings.Builder
	fmt.Fprintf(&b, "out of memory allocating %s on device %d (%s): %s of %s free; "+
		"this process's pool holds %s in use and %s cached",
		FormatBytes(requested), props.Ordinal, name, FormatBytes(free), FormatBytes(total),
		FormatBytes(ps.InUse), FormatBytes(ps.Cached))
	if ps.Limit != 0 {
		fmt.Fprintf(&b, "; its memory limit is %s", FormatBytes(ps.Limit))
	}
	b.WriteString(". ")
	switch {
	case total != 0 && requested > total:
		b.WriteString("The request is larger than the device's total memory: split it (for example into tiles with allocate_tiles), or use managed memory (allocate_managed), which the driver pages in and out of the device.")
	case limitHit:
		fmt.Fprintf(&b, "A memory limit was hit, not the device's capacity: %s of the %s limit is in use. "+
			"Raise the limit (0 removes it) or free memory.", FormatBytes(limitInUse), FormatBytes(ps.Limit))
	case retried && released > 0:
		fmt.Fprintf(&b, "cudacore already released %s of cached memory and retried: free memory or allocate less; "+
			"other processes may hold memory (nvidia-smi shows them).", FormatBytes(released))
	case ps.Cached > 0 && requested <= free+ps.Cached:
		b.WriteString("Release the cached memory and retry, or free memory or allocate less.")
	default:
		b.WriteString("Free memory or allocate less; other processes may hold memory (nvidia-smi shows them).")
	}

	fields := []cuda.Field{
		field("requested", requested), field("free", free), field("total", total),
		{Key: "device", Value: fmt.Sprint(props.Ordinal)},
		field("in_use", ps.InUse), field("cached", ps.Cached),
	}
	if ps.Limit != 0 {
		fields = append(fields, field("limit", ps.Limit))
		if limitHit {
			fields = append(fields, field("limit_in_use", limitInUse))
		}
	}
	// The cause is not chained: its text would repeat the driver's terse message after this one, and the
	// entry point it names is already Op.
	return cuda.NewError(op, cuda.ErrorOutOfMemory, b.String(), fields...)
}
