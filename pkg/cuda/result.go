// Package cuda is cudacore's shared vocabulary for the CUDA driver: every CUresult value with its name
// (Result), the error type that carries one (*Error) with sentinel categories for errors.Is, the
// text form in which errors cross into Python (the wire format), and the Driver interface that the real
// driver (package libcuda) and the simulator (package cudasim) implement.
//
// Nothing here loads a library or touches memory: it is plain data and interfaces, so every other
// package can depend on it.
package cuda

//go:generate go run ./internal/resultgen results.tsv results_gen.go ../../python/cudacore/_results.py

import "strconv"

// Result is a CUresult value. Values below zero are cudacore's own codes for failures that have no
// CUresult (no driver library, a forked process, a closed object, an internal error).
type Result int32

type resultInfo struct {
	code     Result
	name     string
	category error
	descr    string
}

var resultByCode = func() map[Result]*resultInfo {
	m := make(map[Result]*resultInfo, len(resultTable))
	for i := range resultTable {
		m[resultTable[i].code] = &resultTable[i]
	}
	return m
}()

var resultByName = func() map[string]Result {
	m := make(map[string]Result, len(resultTable))
	for _, r := range resultTable {
		m[r.name] = r.code
	}
	return m
}()

// String returns the driver's name for r, such as "CUDA_ERROR_OUT_OF_MEMORY", or "CUresult(N)" for a value
// this build does not know (a newer driver may return one).
func (r Result) String() string {
	if info, ok := resultByCode[r]; ok {
		return info.name
	}
	return "CUresult(" + strconv.Itoa(int(r)) + ")"
}

// Description is a one-line explanation of r.
func (r Result) Description() string {
	if info, ok := resultByCode[r]; ok {
		return info.descr
	}
	return "an error code this version of cudacore does not know"
}

// Known reports whether r appears in the results table.
func (r Result) Known() bool {
	_, ok := resultByCode[r]
	return ok
}

// Category returns the sentinel error for r's category (ErrOutOfMemory, ErrCapture, ...); ErrUnknown for
// a code the table does not have; nil for Success.
func (r Result) Category() error {
	if info, ok := resultByCode[r]; ok {
		return info.category
	}
	return ErrUnknown
}

// ParseResult returns the Result named name ("CUDA_ERROR_OUT_OF_MEMORY" or "CUresult(N)").
func ParseResult(name string) (Result, bool) {
	if r, ok := resultByName[name]; ok {
		return r, true
	}
	if len(name) > len("CUresult()") && name[:9] == "CUresult(" && name[len(name)-1] == ')' {
		n, err := strconv.ParseInt(name[9:len(name)-1], 10, 32)
		if err == nil {
			return Result(n), true
		}
	}
	return 0, false
}

// Results returns every known Result in table order. The slice is new on each call.
func Results() []Result {
	out := make([]Result, len(resultTable))
	for i, r := range resultTable {
		out[i] = r.code
	}
	return out
}
