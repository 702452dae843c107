// nvml.h: the optional NVML query of package libcuda (nvml.c).
#pragma once

// cc_nvml_processes fills pids and used (at most cap entries) with the processes NVML sees on the device
// with that PCI bus id (compute and graphics, each process once) and returns their number, or -1 when
// NVML is not available or does not know the device.
int cc_nvml_processes(const char *pci_bus_id, unsigned int *pids, unsigned long long *used, int cap);
