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

// The layout of nvmlPciInfo_t from NVML's v2 API on (what nvmlDeviceGetNvLinkRemotePciInfo_v2 fills).
typedef struct {
	char busIdLegacy[16];
	unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
	char busId[32];
} nv_pci;

typedef int (*nv_init_t)(void);
typedef int (*nv_handle_t)(const char *, void **);
typedef int (*nv_procs_t)(void *, unsigned int *, nv_proc *);

static pthread_once_t nv_once = PTHREAD_ONCE_INIT;
static nv_handle_t nv_handle;
static nv_procs_t nv_compute, nv_graphics;
// The link queries; any may be missing from an old NVML, and each is then left out of the answer.
static int (*nv_link_state)(void *, unsigned int, int *);
static int (*nv_link_remote_pci)(void *, unsigned int, nv_pci *);
static int (*nv_link_remote_type)(void *, unsigned int, int *);
static int (*nv_p2p_status)(void *, void *, int, int *);
static int (*nv_ancestor)(void *, void *, int *);
static int (*nv_pci_info)(void *, nv_pci *);
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
	nv_link_state = (int (*)(void *, unsigned int, int *))dlsym(h, "nvmlDeviceGetNvLinkState");
	nv_link_remote_pci = (int (*)(void *, unsigned int, nv_pci *))dlsym(h, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
	nv_link_remote_type = (int (*)(void *, unsigned int, int *))dlsym(h, "nvmlDeviceGetNvLinkRemoteDeviceType");
	nv_p2p_status = (int (*)(void *, void *, int, int *))dlsym(h, "nvmlDeviceGetP2PStatus");
	nv_ancestor = (int (*)(void *, void *, int *))dlsym(h, "nvmlDeviceGetTopologyCommonAncestor");
	nv_pci_info = (int (*)(void *, nv_pci *))dlsym(h, "nvmlDeviceGetPciInfo_v3");
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

// NVML's constants for the link queries (nvml.h): NVML_NVLINK_MAX_LINKS is 18 in the headers of the
// H100 era; links past a device's last answer NVML_ERROR_INVALID_ARGUMENT, so a larger bound is safe.
enum {
	NV_MAX_LINKS = 32,
	NV_P2P_CAPS_INDEX_NVLINK = 2,
	NV_NVLINK_DEVICE_TYPE_SWITCH = 2,
	NV_FEATURE_ENABLED = 1,
};

int cc_nvml_link(const char *a, const char *b, cc_nvml_link_t *out) {
	pthread_once(&nv_once, nv_open);
	out->nvlink_p2p = -1;
	out->direct_links = 0;
	out->switch_links = 0;
	out->ancestor = -1;
	if (!nv_ok) return -1;
	void *da = NULL, *db = NULL;
	if (nv_handle(a, &da) != 0 || nv_handle(b, &db) != 0) return -1;
	if (nv_p2p_status != NULL) {
		int status = 0;
		int r = nv_p2p_status(da, db, NV_P2P_CAPS_INDEX_NVLINK, &status);
		out->nvlink_p2p = r == 0 ? status : -1;
	}
	if (nv_ancestor != NULL) {
		int level = 0;
		if (nv_ancestor(da, db, &level) == 0) out->ancestor = level;
	}
	nv_pci want;
	memset(&want, 0, sizeof want);
	int know_b = nv_pci_info != NULL && nv_pci_info(db, &want) == 0;
	if (nv_link_state == NULL) return 0;
	for (unsigned int link = 0; link < NV_MAX_LINKS; link++) {
		int active = 0;
		if (nv_link_state(da, link, &active) != 0) continue;  // no such link, or not supported
		if (active != NV_FEATURE_ENABLED) continue;
		int type = -1;
		if (nv_link_remote_type != NULL && nv_link_remote_type(da, link, &type) == 0 && type == NV_NVLINK_DEVICE_TYPE_SWITCH) {
			out->switch_links++;
			continue;
		}
		nv_pci far;
		memset(&far, 0, sizeof far);
		if (know_b && nv_link_remote_pci != NULL && nv_link_remote_pci(da, link, &far) == 0 &&
		    far.domain == want.domain && far.bus == want.bus && far.device == want.device)
			out->direct_links++;
	}
	return 0;
}
