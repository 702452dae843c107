package process

/*
// cudacore_graph_memory_pending is the process-wide count of graph memory allocations that no launch has
// made real (stream.PendingGraphMemory). The direct path of the hot calls (cudacore/native/fast.c) reads
// it, with the GIL held, and leaves every copy and kernel launch to Go while it is not zero, so that the
// checks of pkg/stream refuse such memory.
volatile int cudacore_graph_memory_pending;

static void cudacore_set_graph_memory_pending(int n) {
	__atomic_store_n(&cudacore_graph_memory_pending, n, __ATOMIC_SEQ_CST);
}
*/
import "C"

import (
	"sync"

	"github.com/cudacore/cudacore/pkg/stream"
)

var pendingMu sync.Mutex

func init() {
	// Under a mutex, with the count read inside it: the last writer has read the latest count.
	stream.SetPendingHook(func() {
		pendingMu.Lock()
		C.cudacore_set_graph_memory_pending(C.int(stream.PendingGraphMemory()))
		pendingMu.Unlock()
	})
}
