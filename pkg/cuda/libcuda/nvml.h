// nvml.h: the optional NVML query of package libcuda (nvml.c).
#pragma once

// cc_nvml_processes fills pids and used (at most cap entries) with the processes NVML sees on the device
// with that PCI bus id (compute and graphics, each process once) and returns their number, or -1 when
// NVML is not available or does not know the device.
int cc_nvml_processes(const char *pci_bus_id, unsigned int *pids, unsigned long long *used, int cap);

// cc_nvml_link_t is what NVML says of the link between two devices (cc_nvml_link).
typedef struct {
	int nvlink_p2p;     // nvmlDeviceGetP2PStatus(NVLINK): 0 when NVML says they talk over NVLink, else NVML's
	                    // status; -1 when this NVML lacks the call
	int direct_links;   // active NVLinks of the first device whose far end is the second device
	int switch_links;   // active NVLinks of the first device whose far end is an NVSwitch
	int ancestor;       // nvmlDeviceGetTopologyCommonAncestor's level (0, 10, ... 50); -1 when unknown
} cc_nvml_link_t;

// cc_nvml_link fills out for the devices with PCI bus ids a and b and returns 0, or returns -1 when NVML is
// not available or knows neither device. It makes no CUDA call.
int cc_nvml_link(const char *a, const char *b, cc_nvml_link_t *out);
