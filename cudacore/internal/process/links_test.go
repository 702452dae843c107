package process

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/cudacore/cudacore/pkg/cuda/libcuda"
)

// What NVML's answers become: NVML's NVLink status decides where it has one, the links ending at the
// other device give the width, links to an NVSwitch stand for it when none do.
func TestLinkFromNVML(t *testing.T) {
	for _, c := range []struct {
		name string
		in   libcuda.Link
		want Link
	}{
		{"two GPUs joined directly", libcuda.Link{NVLink: true, DirectLinks: 18, Ancestor: 50},
			Link{Kind: "nvlink", NVLinks: 18, PCIe: "SYS", NVML: "ok"}},
		{"through an NVSwitch", libcuda.Link{NVLink: true, SwitchLinks: 18, Ancestor: 40},
			Link{Kind: "nvlink", NVLinks: 18, NVSwitch: true, PCIe: "NODE", NVML: "ok"}},
		{"PCIe under one switch", libcuda.Link{NVLinkStatus: 4, Ancestor: 10},
			Link{Kind: "pcie", PCIe: "PIX", NVML: "ok"}},
		{"status refused, links to the peer decide nothing", libcuda.Link{NVLinkStatus: 4, DirectLinks: 2, Ancestor: 30},
			Link{Kind: "pcie", PCIe: "PHB", NVML: "ok"}},
		{"an NVML without the status call", libcuda.Link{NVLinkStatus: -1, DirectLinks: 4, Ancestor: -1},
			Link{Kind: "nvlink", NVLinks: 4, NVML: "ok"}},
		{"an NVML without the status call, no links", libcuda.Link{NVLinkStatus: -1, SwitchLinks: 6, Ancestor: 20},
			Link{Kind: "pcie", PCIe: "PXB", NVML: "ok"}},
	} {
		var got Link
		got.fromNVML(c.in)
		assert.Equal(t, c.want, got, c.name)
	}
}
