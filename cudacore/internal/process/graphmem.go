package process

import (
	"sync"

	"github.com/cudacore/cudacore/cudacore/internal/snapshot"
	"github.com/cudacore/cudacore/pkg/stream"
)

var pendingMu sync.Mutex

func init() {
	// The count of graph memory allocations no launch has made real goes to the C fast path (package
	// snapshot), which leaves every copy and kernel launch to Go while it is not zero, so that the checks
	// of pkg/stream refuse such memory. Under a mutex, with the count read inside it: the last writer has
	// read the latest count.
	stream.SetPendingHook(func() {
		pendingMu.Lock()
		snapshot.SetGraphMemoryPending(stream.PendingGraphMemory())
		pendingMu.Unlock()
	})
}
