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

// Link is what NVML says of the link from one device to another.
type Link struct {
	// NVLink is true when NVML's peer-to-peer status for NVLink is OK between the two devices.
	NVLink bool
	// NVLinkStatus is NVML's status for that query (0 OK), or -1 when this NVML lacks it.
	NVLinkStatus int
	// DirectLinks counts the first device's active NVLinks whose far end is the second device.
	DirectLinks int
	// SwitchLinks counts the first device's active NVLinks whose far end is an NVSwitch.
	SwitchLinks int
	// Ancestor is NVML's common-ancestor level of the two devices on the PCIe tree (0 the same board, 10
	// one switch, 20 several switches, 30 a host bridge, 40 one NUMA node, 50 across NUMA nodes), or -1.
	Ancestor int
}

// LinkBetween asks NVML about the link between the devices with PCI bus ids a and b. ok is false when
// libnvidia-ml.so.1 is absent, fails to initialize, or knows neither device. It makes no CUDA call, so it
// is safe while a stream captures.
func LinkBetween(a, b string) (link Link, ok bool) {
	ca, cb := C.CString(a), C.CString(b)
	defer C.free(unsafe.Pointer(ca))
	defer C.free(unsafe.Pointer(cb))
	var out C.cc_nvml_link_t
	if C.cc_nvml_link(ca, cb, &out) != 0 {
		return Link{}, false
	}
	return Link{
		NVLink:       out.nvlink_p2p == 0,
		NVLinkStatus: int(out.nvlink_p2p),
		DirectLinks:  int(out.direct_links),
		SwitchLinks:  int(out.switch_links),
		Ancestor:     int(out.ancestor),
	}, true
}
