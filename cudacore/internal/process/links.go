package process

import (
	"fmt"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cuda/libcuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
	"github.com/cudacore/cudacore/pkg/device"
)

// Link is what cudacore can tell of the path from one device to another: the driver's peer-to-peer
// attributes and, where NVML answers, the kind of link and its width. doctor shows it
// (docs/guide/multi-gpu.md, "doctor").
type Link struct {
	// The driver's attributes of the path from the first device to the second (cuDeviceGetP2PAttribute).
	Access          bool `json:"access"`
	NativeAtomics   bool `json:"native_atomics"`
	PerformanceRank int  `json:"performance_rank"`
	// Kind is "nvlink" or "pcie" as NVML tells them apart, "" when NVML does not answer (NVML says why).
	Kind string `json:"kind"`
	// NVLinks is the link's width: the first device's active NVLinks that end at the second device, or,
	// through an NVSwitch (NVSwitch true), those that end at a switch.
	NVLinks  int  `json:"nvlinks"`
	NVSwitch bool `json:"nvswitch"`
	// PCIe is where the two devices meet on the PCIe tree, in nvidia-smi's words: "board" (one board),
	// "PIX" (one PCIe switch), "PXB" (several switches), "PHB" (a host bridge), "NODE" (one NUMA node),
	// "SYS" (across NUMA nodes); "" when NVML does not say.
	PCIe string `json:"pcie"`
	// NVML is "ok", or why NVML gave no answer.
	NVML string `json:"nvml"`
}

// pcieLevels names NVML's common-ancestor levels (nvmlGpuTopologyLevel_t) as nvidia-smi topo does.
var pcieLevels = map[int]string{0: "board", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}

const noNVML = "NVML (libnvidia-ml.so.1) is not available here or does not know these devices"

// LinkBetween reports the path from the device at ordinal a to the device at ordinal b. It opens neither
// device and makes no call that a stream capture forbids: device attribute queries, which need no
// context, and NVML, which is not CUDA (docs/contributing/driver-facts.md, "Links between devices").
func LinkBetween(a, b int) (Link, error) {
	const op = "cudacore.link"
	drv, _, err := Driver()
	if err != nil {
		return Link{}, err
	}
	if a == b {
		return Link{}, cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf("device %d is itself; a link is between two devices", a))
	}
	n, err := device.Count(drv)
	if err != nil {
		return Link{}, err
	}
	for _, o := range []int{a, b} {
		if o < 0 || o >= n {
			return Link{}, cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf("device %d does not exist: there are %d devices", o, n))
		}
	}
	da, err := drv.DeviceGet(a)
	if err != nil {
		return Link{}, err
	}
	db, err := drv.DeviceGet(b)
	if err != nil {
		return Link{}, err
	}
	var l Link
	for _, q := range []struct {
		attr cuda.P2PAttribute
		set  func(int)
	}{
		{cuda.P2PAccessSupported, func(v int) { l.Access = v != 0 }},
		{cuda.P2PNativeAtomicSupport, func(v int) { l.NativeAtomics = v != 0 }},
		{cuda.P2PPerformanceRank, func(v int) { l.PerformanceRank = v }},
	} {
		v, err := drv.DeviceGetP2PAttribute(q.attr, da, db)
		if err != nil {
			return Link{}, err
		}
		q.set(v)
	}
	l.NVML = noNVML
	if sim, ok := drv.(*cudasim.Driver); ok {
		if n, ok := sim.LinkBetween(a, b); ok {
			l.fromNVML(libcuda.Link{NVLinkStatus: -1, DirectLinks: n.DirectLinks, Ancestor: n.Ancestor})
		}
		return l, nil
	}
	busA, err := drv.DevicePCIBusID(da)
	if err != nil {
		return Link{}, err
	}
	busB, err := drv.DevicePCIBusID(db)
	if err != nil {
		return Link{}, err
	}
	if n, ok := libcuda.LinkBetween(busA, busB); ok {
		l.fromNVML(n)
	}
	return l, nil
}

// fromNVML fills the NVML part of l. NVLink is taken from NVML's peer-to-peer status where it has one, and
// from the links that end at the other device otherwise.
func (l *Link) fromNVML(n libcuda.Link) {
	l.NVML = "ok"
	l.PCIe = pcieLevels[n.Ancestor]
	nvlink := n.NVLink || n.NVLinkStatus < 0 && n.DirectLinks > 0
	switch {
	case nvlink && n.DirectLinks > 0:
		l.Kind, l.NVLinks = "nvlink", n.DirectLinks
	case nvlink:
		l.Kind, l.NVLinks, l.NVSwitch = "nvlink", n.SwitchLinks, n.SwitchLinks > 0
	default:
		l.Kind = "pcie"
	}
}

// NCCLMemory is what NCCL asks of a buffer before it registers it with a peer process of its
// communicator (docs/contributing/driver-facts.md, "NCCL's user buffers").
type NCCLMemory struct {
	// Retain is "ok" when the driver gives the buffer's physical allocation handle
	// (cuMemRetainAllocationHandle: memory mapped with cuMemMap), NCCL's own way; else the driver's error.
	Retain string `json:"retain"`
	// HandleTypes is the bitmask of handle types the allocation can be exported as (1: a POSIX file
	// descriptor, which NCCL's cuMem path needs between processes).
	HandleTypes uint64 `json:"handle_types"`
	// LegacyIPC is true for memory cuIpcGetMemHandle can export (cuMemAlloc's): NCCL registers it only
	// with NCCL_LEGACY_CUDA_REGISTER=1.
	LegacyIPC bool `json:"legacy_ipc"`
}

// ProbeNCCLMemory asks the driver what NCCL would of the memory at p on d. It only reads attributes; a
// handle it retains is released at once.
func (d *Device) ProbeNCCLMemory(p cuda.DevicePtr) (NCCLMemory, error) {
	drv, ctx := d.Driver(), d.Context()
	legacy, err := drv.PointerGetAttribute(ctx, cuda.PointerLegacyIpcCapable, p)
	if err != nil {
		return NCCLMemory{}, err
	}
	types, err := drv.PointerGetAttribute(ctx, cuda.PointerAllowedHandleTypes, p)
	if err != nil {
		return NCCLMemory{}, err
	}
	m := NCCLMemory{LegacyIPC: legacy != 0, HandleTypes: types, Retain: "ok"}
	h, err := drv.MemRetainAllocationHandle(ctx, p)
	if err != nil {
		m.Retain = err.Error()
	} else if err := drv.MemRelease(ctx, h); err != nil {
		return NCCLMemory{}, err
	}
	return m, nil
}
