// nvml.c: the optional NVML half of package libcuda. libnvidia-ml is opened on first use with dlopen, like
// libcuda; where it is absent every query answers "not available" and nothing else changes.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "nvml.h"

// The layout of nvmlProcessInfo_v2_t / _v3 (identical): pid, usedGpuMemory, gpuInstanceId, computeInstanceId.
typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
	unsigned int gpuInstanceId;
	unsigned int computeInstanceId;
} nv_proc;

typedef int (*nv_init_t)(void);
typedef int (*nv_handle_t)(const char *, void **);
typedef int (*nv_procs_t)(void *, unsigned int *, nv_proc *);

static pthread_once_t nv_once = PTHREAD_ONCE_INIT;
static nv_handle_t nv_handle;
static nv_procs_t nv_compute, nv_graphics;
static int nv_ok;

static void nv_open(void) {
	void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) return;
	nv_init_t init = (nv_init_t)dlsym(h, "nvmlInit_v2");
	nv_handle = (nv_handle_t)dlsym(h, "nvmlDeviceGetHandleByPciBusId_v2");
	nv_compute = (nv_procs_t)dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3");
	if (nv_compute == NULL) nv_compute = (nv_procs_t)dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v2");
	nv_graphics = (nv_procs_t)dlsym(h, "nvmlDeviceGetGraphicsRunningProcesses_v3");
	if (nv_graphics == NULL) nv_graphics = (nv_procs_t)dlsym(h, "nvmlDeviceGetGraphicsRunningProcesses_v2");
	if (init == NULL || nv_handle == NULL || nv_compute == NULL || init() != 0) return;
	nv_ok = 1;
}

int cc_nvml_processes(const char *pci_bus_id, unsigned int *pids, unsigned long long *used, int cap) {
	pthread_once(&nv_once, nv_open);
	if (!nv_ok) return -1;
	void *dev = NULL;
	if (nv_handle(pci_bus_id, &dev) != 0) return -1;
	nv_proc buf[64];
	int n = 0;
	nv_procs_t fns[2] = {nv_compute, nv_graphics};
	for (int k = 0; k < 2; k++) {
		if (fns[k] == NULL) continue;
		unsigned int count = 64;
		memset(buf, 0, sizeof buf);
		if (fns[k](dev, &count, buf) != 0) continue;
		for (unsigned int i = 0; i < count && n < cap; i++) {
			int dup = 0;
			for (int j = 0; j < n; j++) dup |= pids[j] == buf[i].pid;
			if (dup) continue;
			pids[n] = buf[i].pid;
			// NVML reports NVML_VALUE_NOT_AVAILABLE (all ones) where it cannot see the usage.
			used[n] = buf[i].usedGpuMemory == ~0ULL ? 0 : buf[i].usedGpuMemory;
			n++;
		}
	}
	return n;
}
