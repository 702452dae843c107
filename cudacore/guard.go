package cudacore

import (
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/cudacore/cudacore/cudacore/internal/process"
	"github.com/cudacore/cudacore/pkg/cuda"
)

// guard runs fn, recovers a panic into a CUDACORE_ERROR_INTERNAL error carrying the stack, and renders
// any error in the wire format. Every exported function's body goes through it.
//
// Around fn it keeps the recycle log (process.Replay, process.Publish) in step: before fn, Go applies
// the frees and allocations that C served without entering Go, so fn sees them all; after fn, C learns
// whether it may go on serving them, given what fn changed (a capture begun or ended, graph memory, the
// strategy).
func guard[T any](op string, fn func() (T, error)) (v T, err error) {
	defer func() {
		process.Publish()
		if p := recover(); p != nil {
			var zero T
			v = zero
			err = wireError(&cuda.Error{Op: op, Result: cuda.ErrorInternal,
				Msg: fmt.Sprintf("panic: %v\n%s", p, debug.Stack())})
		}
	}()
	process.Replay()
	v, err = fn()
	if err != nil {
		var zero T
		return zero, wireError(err)
	}
	return v, nil
}

// wireError is an error whose text is the wire form; gopy passes err.Error() to Python as is.
type wireErr struct{ text string }

func (w wireErr) Error() string { return w.text }

func wireError(err error) error {
	var w wireErr
	if errors.As(err, &w) {
		return w
	}
	return wireErr{cuda.Encode(err)}
}
