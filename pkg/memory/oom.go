package memory

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/device"
)

// PoolState is what this process's allocator holds when an allocation fails, for the message and the
// verdict.
type PoolState struct {
	InUse  uint64 // bytes handed out through the allocator
	Cached uint64 // bytes held for reuse (cache plus pool reserve)
	Limit  uint64 // the byte limit, 0 for none
	// Pool says the allocation came from a stream-ordered pool (then a refused reservation is told apart
	// from fragmentation by Probe).
	Pool bool
	// Others lists the other processes' memory on the device (NVML, or the simulator); nil, or ok false,
	// when no such source is available: then the gap between the device's free memory and this process's
	// accounting stands in for it.
	Others func() (procs []ProcessUsage, ok bool)
	// Probe says whether one block of size bytes can be had from the device outside the pool now (it
	// allocates and frees it at once). Used only when the device reports enough free memory.
	Probe func(size uint64) bool
	// Outside is the device memory this process holds outside this allocator (shareable memory, managed
	// memory, graph memory): it is this process's, never other processes', in the verdict.
	Outside uint64
	// MaxSize is the pool's maximum size (cudacore.share_pool's max_size), 0 for none; PoolReserved is
	// what the pool reserves, over every library drawing from it.
	MaxSize, PoolReserved uint64
	// PoolOthers is what the other libraries of this process hold in the allocator's pool (its use
	// minus the allocator's share): a pool serves one process, so these bytes are this process's in the
	// verdict, never other processes'.
	PoolOthers uint64
}

// ProcessUsage is one other process's memory on a device.
type ProcessUsage struct {
	PID  int
	Used uint64
}

// The causes of an out-of-memory verdict (the cause field of the error; OutOfMemoryError.cause in Python).
const (
	CauseExhausted       = "exhausted"        // this process holds the memory
	CauseOtherProcesses  = "other_processes"  // memory is held outside this process's allocator
	CauseFragmentation   = "fragmentation"    // enough free in total, not in one block
	CauseLimit           = "limit"            // a cudacore memory limit was hit
	CausePoolReservation = "pool_reservation" // the driver refused the pool's reservation though memory is free
	CausePoolMaxSize     = "pool_max_size"    // the pool would grow beyond its maximum size
	CauseTooLarge        = "too_large"        // more than the device's total memory
	CauseInjected        = "injected"         // a fault injected into the driver (the simulator) answered it
)

// causeLead is the start of the message for each cause.
var causeLead = map[string]string{
	CauseExhausted:       "memory exhausted by this process",
	CauseOtherProcesses:  "memory held by other processes",
	CauseFragmentation:   "fragmentation or cache: enough memory is free in total but not in one block",
	CauseLimit:           "a cudacore memory limit was hit",
	CausePoolReservation: "the driver refused the pool's reservation",
	CausePoolMaxSize:     "the pool reached its maximum size",
	CauseTooLarge:        "the request is larger than the device",
	CauseInjected:        "injected by cudacore.testing",
}

// gapSlack is what the gap between the device's used memory and this process's allocator may hold without
// being blamed on other processes: the context's own reserve (about 530 MiB on the H100) and small
// allocations of other libraries in this process.
const gapSlack = 1 << 30

// OutOfMemory builds the out-of-memory error users see for a failed allocation of requested bytes on d.
//
// Op is the entry point that failed, taken from cause (cuMemAllocFromPoolAsync, cuMemAlloc_v2, or
// LimitOp when a limit was hit). Fields: cause (the verdict, one of the Cause constants), requested, free,
// total, device, in_use, cached, released (what Retry released before it failed again), others (bytes
// held outside this process's allocator) with others_source ("nvml" or "gap"), and limit when a limit is
// set (with limit_in_use when it was the limit that was hit). The message leads with the verdict, gives
// the numbers for a person and ends with what to try. The verdict, in order:
//   - too_large: the request is larger than the device's total memory;
//   - limit: a limit was hit;
//   - pool_max_size: the pool has a maximum size and the request does not fit below it;
//   - the device reports enough free memory yet the allocation failed: pool_reservation when a block of
//     that size can be had outside the pool (Probe), else fragmentation;
//   - other_processes: memory held outside this allocator (other processes by NVML, or the gap) would
//     have made room and is more than this process holds;
//   - exhausted: otherwise.
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

	// What is held outside this process: other processes by NVML when it answers, else the gap between
	// the device's used memory and what this process is known to hold (its allocator and Outside).
	ours := ps.InUse + ps.Cached + ps.Outside + ps.PoolOthers
	var gap uint64
	if total > free+ours {
		gap = total - free - ours
	}
	others, source, procs, nvmlSaw := gap, "gap", []ProcessUsage(nil), false
	if ps.Others != nil {
		if list, ok := ps.Others(); ok {
			var sum uint64
			for _, p := range list {
				sum += p.Used
			}
			// NVML cannot see processes of other containers (PID namespaces): when it explains much less
			// than the gap, the gap is the better estimate.
			nvmlSaw = true
			if sum+gapSlack >= gap {
				others, source, procs = sum, "nvml", list
			}
		}
	}

	verdict := CauseExhausted
	switch {
	case total != 0 && requested > total:
		verdict = CauseTooLarge
	case limitHit:
		verdict = CauseLimit
	case ps.MaxSize != 0 && (requested > ps.MaxSize || ps.PoolReserved > ps.MaxSize-requested):
		verdict = CausePoolMaxSize
	case free >= requested:
		verdict = CauseFragmentation
		if ps.Pool && ps.Probe != nil && ps.Probe(requested) {
			verdict = CausePoolReservation
		}
	case others > ours && (source == "nvml" && others > 0 || others > gapSlack) && requested <= free+others:
		verdict = CauseOtherProcesses
	}

	// A failure that a fault injected into the driver made (cudacore.testing, CUDACORE_SIM_FAULTS) says so:
	// the device's state would blame something that is not there. What that state says is kept as
	// cause_without_fault.
	without := ""
	if cuda.Injected(cause) {
		without, verdict = verdict, CauseInjected
	}

	var b strings.Builder
	fmt.Fprintf(&b, "%s: out of memory allocating %s on device %d (%s): %s of %s free; "+
		"this process's pool holds %s in use and %s cached",
		causeLead[verdict], FormatBytes(requested), props.Ordinal, name, FormatBytes(free), FormatBytes(total),
		FormatBytes(ps.InUse), FormatBytes(ps.Cached))
	if ps.PoolOthers != 0 {
		fmt.Fprintf(&b, ", the process's other libraries %s in the same pool", FormatBytes(ps.PoolOthers))
	}
	if ps.Outside != 0 {
		fmt.Fprintf(&b, ", and %s outside it (shareable, managed and graph memory)", FormatBytes(ps.Outside))
	}
	if ps.Limit != 0 {
		fmt.Fprintf(&b, "; its memory limit is %s", FormatBytes(ps.Limit))
	}
	b.WriteString(". ")
	switch verdict {
	case CauseInjected:
		fmt.Fprintf(&b, "The simulator's fault injection answered this allocation (cudacore.testing or "+
			"CUDACORE_SIM_FAULTS); without it the verdict would be %s.", without)
	case CauseTooLarge:
		b.WriteString("The request is larger than the device's total memory: split it (for example into tiles with allocate_tiles), or use managed memory (allocate_managed), which the driver pages in and out of the device.")
	case CauseLimit:
		fmt.Fprintf(&b, "A memory limit was hit, not the device's capacity: %s of the %s limit is in use. "+
			"Raise the limit (0 removes it) or free memory.", FormatBytes(limitInUse), FormatBytes(ps.Limit))
	case CausePoolMaxSize:
		fmt.Fprintf(&b, "The pool reserves %s of its maximum size of %s (cudacore.share_pool's max_size), and every "+
			"library of the process draws from it: free memory in any of them (memory_stats()[\"by_library\"] "+
			"says which holds what), or share a pool with a larger maximum size.",
			FormatBytes(ps.PoolReserved), FormatBytes(ps.MaxSize))
	case CausePoolReservation:
		fmt.Fprintf(&b, "The device has %s free and a block of %s can be allocated outside the pool, but the "+
			"stream-ordered pool could not reserve it (vGPU and some drivers limit pool reservations): "+
			"use the synchronous allocator (set_allocation_strategy(\"sync\")) or allocate less.",
			FormatBytes(free), FormatBytes(requested))
	case CauseFragmentation:
		if retried {
			what := "released " + FormatBytes(released) + " of cached memory"
			if released == 0 {
				what = "found nothing cached to release"
			}
			fmt.Fprintf(&b, "cudacore %s and retried, but no free block of %s exists: "+
				"allocate in smaller pieces (tiles), or free and reallocate long-lived buffers together.",
				what, FormatBytes(requested))
		} else {
			fmt.Fprintf(&b, "No free block of %s exists: release the cached memory and retry, or allocate in "+
				"smaller pieces (tiles).", FormatBytes(requested))
		}
	case CauseOtherProcesses:
		if source == "nvml" {
			fmt.Fprintf(&b, "Other processes hold %s on this device (NVML):", FormatBytes(others))
			for i, p := range procs {
				if i == 5 {
					fmt.Fprintf(&b, " and %d more", len(procs)-i)
					break
				}
				fmt.Fprintf(&b, " pid %d %s", p.PID, FormatBytes(p.Used))
				if i < len(procs)-1 && i < 4 {
					b.WriteByte(',')
				}
			}
			b.WriteString("; stop them, or wait for them to finish.")
		} else {
			why := "NVML was not available to tell them apart"
			if nvmlSaw {
				why = "NVML sees less than that: processes in other containers are invisible to it"
			}
			fmt.Fprintf(&b, "%s of the device is used outside this process's allocator (other processes, or other "+
				"libraries in this process; %s): nvidia-smi on the host shows the processes.",
				FormatBytes(others), why)
		}
	default:
		if retried && released > 0 {
			fmt.Fprintf(&b, "cudacore already released %s of cached memory and retried: free memory or allocate less.",
				FormatBytes(released))
		} else {
			b.WriteString("Free memory (close buffers you no longer need) or allocate less.")
		}
	}

	fields := []cuda.Field{
		{Key: "cause", Value: verdict},
		field("requested", requested), field("free", free), field("total", total),
		{Key: "device", Value: fmt.Sprint(props.Ordinal)},
		field("in_use", ps.InUse), field("cached", ps.Cached), field("outside", ps.Outside), field("released", released),
		field("others", others), {Key: "others_source", Value: source},
	}
	if ps.PoolOthers != 0 {
		fields = append(fields, field("pool_others", ps.PoolOthers))
	}
	if without != "" {
		fields = append(fields, cuda.Field{Key: "cause_without_fault", Value: without})
	}
	if ps.MaxSize != 0 {
		fields = append(fields, field("max_size", ps.MaxSize), field("pool_reserved", ps.PoolReserved))
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
