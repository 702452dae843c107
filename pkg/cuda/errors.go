package cuda

import (
	"errors"
	"strings"
)

// Sentinel categories. Every Result belongs to one; match with errors.Is(err, cuda.ErrOutOfMemory).
// They are the Go side of the Python exception hierarchy (see wire.go).
var (
	ErrInvalidValue   = errors.New("invalid value")
	ErrOutOfMemory    = errors.New("out of memory")
	ErrNotInitialized = errors.New("driver not initialized")
	ErrDriverNotFound = errors.New("CUDA driver not found")
	ErrInvalidDevice  = errors.New("invalid device")
	ErrInvalidImage   = errors.New("invalid kernel image")
	ErrInvalidHandle  = errors.New("invalid handle")
	ErrIllegalState   = errors.New("illegal state")
	ErrNotSupported   = errors.New("not supported")
	ErrNotFound       = errors.New("not found")
	ErrNotReady       = errors.New("not ready")
	ErrLaunch         = errors.New("launch failed")
	ErrDeviceFault    = errors.New("device fault")
	ErrCapture        = errors.New("stream capture error")
	ErrUnknown        = errors.New("unknown error")
)

// Field is one structured detail of an Error (say requested=1099511627776). Values hold no spaces, braces
// or '=' so that they survive the wire format.
type Field struct {
	Key, Value string
}

// FieldInjected is the field, "true", of an error that a fault injected into the driver answered a call
// with (the simulator's fault injection): whoever reports the failure says it was injected.
const FieldInjected = "injected"

// Injected says whether err, or an error it wraps, was answered by an injected fault (FieldInjected).
func Injected(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	v, ok := e.Field(FieldInjected)
	return ok && v == "true"
}

// Error is a failure of a driver call or of a cudacore operation that stands for one.
//
// Op names the entry point (cuMemAllocAsync) or the cudacore operation (cudacore.allocate). Msg says, for a
// person, what was being done and what to do about it; it may be empty. Fields carry numbers that callers
// read back (the Python OutOfMemoryError takes requested, free and total from them). Err, if set, is a
// lower-level cause that errors.Unwrap reaches.
type Error struct {
	Op     string
	Result Result
	Msg    string
	Fields []Field
	Err    error
}

// NewError returns an *Error for a failed call of op.
func NewError(op string, r Result, msg string, fields ...Field) *Error {
	return &Error{Op: op, Result: r, Msg: msg, Fields: fields}
}

// Check returns nil for Success and an *Error naming op otherwise: the usual wrapper for a raw call.
func Check(op string, r Result) error {
	if r == Success {
		return nil
	}
	return &Error{Op: op, Result: r}
}

// Error renders "op: CUDA_ERROR_X: description" for a bare driver failure, and "message (op:
// CUDA_ERROR_X)" when a message says more: the driver's generic description would only repeat it less
// precisely. A cause, if any, follows after ": ".
func (e *Error) Error() string {
	var b strings.Builder
	if e.Msg != "" {
		b.WriteString(e.Msg)
		b.WriteString(" (")
		b.WriteString(e.Op)
		b.WriteString(": ")
		b.WriteString(e.Result.String())
		b.WriteString(")")
	} else {
		b.WriteString(e.Op)
		b.WriteString(": ")
		b.WriteString(e.Result.String())
		if e.Result.Known() {
			b.WriteString(": ")
			b.WriteString(e.Result.Description())
		}
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns the lower-level cause, if any.
func (e *Error) Unwrap() error { return e.Err }

// Is matches e's category sentinel, so errors.Is(err, ErrOutOfMemory) works through any wrapping.
func (e *Error) Is(target error) bool {
	c := e.Result.Category()
	return c != nil && c == target
}

// Field returns the value of the named field and whether it is present.
func (e *Error) Field(key string) (string, bool) {
	for _, f := range e.Fields {
		if f.Key == key {
			return f.Value, true
		}
	}
	return "", false
}

// ResultOf returns the Result of the first *Error in err's chain: Success for nil, ErrorUnknown for an
// error that carries none.
func ResultOf(err error) Result {
	if err == nil {
		return Success
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Result
	}
	return ErrorUnknown
}
