package process

/*
#include <stdlib.h>
*/
import "C"

import "unsafe"

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
