package process

/*
#include <stdlib.h>
*/
import "C"

import (
	"fmt"
	"strconv"
	"strings"
	"unsafe"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// getenv reads the process's live C environment. In a c-shared library Go's os.Getenv sees only the
// environment the process started with (the runtime copies envp when the library loads), so a variable
// set from Python with os.environ before first use, as tests and notebooks do, would be missed.
func getenv(name string) string {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	v := C.getenv(cname)
	if v == nil {
		return ""
	}
	return C.GoString(v)
}

// envDirect turns the direct path of the hot calls off ("0": every call goes through Go, to compare or to
// rule it out) or leaves it on ("1", or unset), for the devices opened after it is set.
const envDirect = "CUDACORE_DIRECT"

// envRecycle turns the recycle log off ("0": every free and allocation goes through Go) or leaves it on
// ("1", or unset); it is read once, when the first device opens.
const envRecycle = "CUDACORE_RECYCLE"

// switchOn parses the value v of name, an on/off setting that is on by default. Anything but "0", "1" or
// nothing is an InvalidValue error naming the variable, so that a typo does not pass for the default.
func switchOn(name, v string) (bool, error) {
	switch strings.TrimSpace(v) {
	case "", "1":
		return true, nil
	case "0":
		return false, nil
	}
	return false, cuda.NewError("cudacore.device", cuda.ErrorInvalidValue, fmt.Sprintf(
		"%s=%q: must be 0 (off) or 1 (on, the default)", name, v))
}

// envPageableDirectMax overrides stream.Options.PageableDirectMax for the devices opened after it is set:
// the largest copy of pageable memory, in bytes, that goes to the driver's own copy rather than through
// cudacore's staging buffers (asynchronous host-to-device copies, synchronous ones both ways); 0 stages
// every such copy. Where the crossover lies depends on the host's memory bandwidth and the driver
// (bench/copies.py --kinds "pageable async" finds it).
const envPageableDirectMax = "CUDACORE_PAGEABLE_DIRECT_MAX"

// pageableDirectMax parses the value of envPageableDirectMax into a PageableDirectMax: 0 (the default)
// when unset, -1 (stage every copy) for "0". Anything but a byte count is an InvalidValue error naming
// the variable.
func pageableDirectMax(v string) (int, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 0)
	if err != nil || n < 0 {
		return 0, cuda.NewError("cudacore.device", cuda.ErrorInvalidValue, fmt.Sprintf(
			"%s=%q: must be a byte count >= 0 (copies up to it go to the driver's own pageable copy; 0 stages every one)",
			envPageableDirectMax, v))
	}
	if n == 0 {
		return -1, nil
	}
	return int(n), nil
}
