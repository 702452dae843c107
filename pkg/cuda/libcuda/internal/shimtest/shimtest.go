// Package shimtest runs parts of the libcuda shim (pkg/cuda/libcuda/shim.c) against a fake table of
// entry points, so that what the shim does without calling the driver through Go (the per-thread stream
// drain at thread exit) is tested where there is no GPU. It compiles its own copy of shim.c and is
// imported by its tests only.
package shimtest

/*
#cgo LDFLAGS: -ldl -lpthread
#include <pthread.h>
#include "../../shim.c"

static int fake_syncs_per_thread; // synchronizes of CU_STREAM_PER_THREAD, by the drain
static int fake_syncs_other;
static __thread uintptr_t fake_current;

static CUresult fake_get_current(CUcontext *c) { *c = (CUcontext)fake_current; return 0; }
static CUresult fake_set_current(CUcontext c) { fake_current = (uintptr_t)c; return 0; }
static CUresult fake_sync(CUstream s) {
	__atomic_add_fetch((uintptr_t)s == 2 ? &fake_syncs_per_thread : &fake_syncs_other, 1, __ATOMIC_SEQ_CST);
	return 0;
}

static cc_table fake_table;

typedef struct {
	int contexts;   // how many distinct contexts the thread registers
	int repeats;    // how often it registers each
	int registered; // out: how many registrations were refused (nonzero results)
} thread_job;

static void *thread_main(void *arg) {
	thread_job *j = arg;
	for (int r = 0; r < j->repeats; r++) {
		for (int c = 0; c < j->contexts; c++) {
			if (cc_drainPerThreadAtExit(&fake_table, (uintptr_t)(0x1000 + c)) != 0) j->registered++;
		}
	}
	return NULL;
}

// Run one thread that registers, and return the drains its exit made.
static int run_thread(int contexts, int repeats, int *refused) {
	fake_table.cuCtxGetCurrent = fake_get_current;
	fake_table.cuCtxSetCurrent = fake_set_current;
	fake_table.cuStreamSynchronize = fake_sync;
	int before = __atomic_load_n(&fake_syncs_per_thread, __ATOMIC_SEQ_CST);
	thread_job j = {contexts, repeats, 0};
	pthread_t t;
	if (pthread_create(&t, NULL, thread_main, &j) != 0) return -1;
	pthread_join(t, NULL);
	*refused = j.registered;
	return __atomic_load_n(&fake_syncs_per_thread, __ATOMIC_SEQ_CST) - before;
}

static int other_syncs(void) { return __atomic_load_n(&fake_syncs_other, __ATOMIC_SEQ_CST); }
*/
import "C"

// RunThread starts a thread that asks, repeats times for each of contexts contexts, for its per-thread
// default stream to be drained at exit, lets it exit, and returns how many drains (synchronizes of
// CU_STREAM_PER_THREAD) its exit made and how many requests were refused.
func RunThread(contexts, repeats int) (drains, refused int) {
	var r C.int
	d := C.run_thread(C.int(contexts), C.int(repeats), &r)
	return int(d), int(r)
}

// OtherSyncs returns how many synchronizes of other streams the fake driver saw (the drain makes none).
func OtherSyncs() int { return int(C.other_syncs()) }
