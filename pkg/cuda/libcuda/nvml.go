package libcuda

/*
#cgo LDFLAGS: -ldl -lpthread
#include <stdlib.h>
#include "nvml.h"
*/
import "C"

import (
	"os"
	"unsafe"
)

// Process is another process's memory on a device, as NVML reports it.
type Process struct {
	PID  int
	Used uint64
}

// OtherProcesses lists the processes other than this one that NVML sees on the device with the given PCI
// bus id ("0000:18:00.0"). ok is false when libnvidia-ml.so.1 is absent, fails to initialize, or does not
// know the device: NVML is optional, and callers fall back to their own estimate.
func OtherProcesses(pciBusID string) (procs []Process, ok bool) {
	const capacity = 128
	var pids [capacity]C.uint
	var used [capacity]C.ulonglong
	cs := C.CString(pciBusID)
	defer C.free(unsafe.Pointer(cs))
	n := int(C.cc_nvml_processes(cs, &pids[0], &used[0], capacity))
	if n < 0 {
		return nil, false
	}
	self := os.Getpid()
	procs = []Process{}
	for i := 0; i < n; i++ {
		if int(pids[i]) != self {
			procs = append(procs, Process{PID: int(pids[i]), Used: uint64(used[i])})
		}
	}
	return procs, true
}
