package cuda

import (
	"os"
	"testing"

	"github.com/cudacore/cudacore/pkg/cuda/internal/resultgen/gen"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEveryResultHasNameCategoryAndRoundTrips(t *testing.T) {
	all := Results()
	require.Greater(t, len(all), 100, "the table should hold every CUresult value")
	seen := map[Result]bool{}
	for _, r := range all {
		assert.False(t, seen[r], "duplicate code %d", r)
		seen[r] = true
		assert.True(t, r.Known())
		name := r.String()
		assert.Regexp(t, `^(CUDA|CUDACORE)_`, name)
		assert.NotEmpty(t, r.Description())
		back, ok := ParseResult(name)
		assert.True(t, ok, name)
		assert.Equal(t, r, back, name)
		if r == Success {
			assert.Nil(t, r.Category())
		} else {
			assert.NotNil(t, r.Category(), name)
		}
	}
}

func TestResultNamesAndCategories(t *testing.T) {
	cases := []struct {
		r        Result
		name     string
		category error
	}{
		{ErrorOutOfMemory, "CUDA_ERROR_OUT_OF_MEMORY", ErrOutOfMemory},
		{ErrorInvalidValue, "CUDA_ERROR_INVALID_VALUE", ErrInvalidValue},
		{ErrorStreamCaptureImplicit, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", ErrCapture},
		{ErrorStreamCaptureUnsupported, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", ErrCapture},
		{ErrorStreamCaptureInvalidated, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", ErrCapture},
		{ErrorLaunchOutOfResources, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", ErrLaunch},
		{ErrorNotSupported, "CUDA_ERROR_NOT_SUPPORTED", ErrNotSupported},
		{ErrorDriverNotFound, "CUDACORE_ERROR_DRIVER_NOT_FOUND", ErrDriverNotFound},
		{ErrorNotReady, "CUDA_ERROR_NOT_READY", ErrNotReady},
		{ErrorIllegalAddress, "CUDA_ERROR_ILLEGAL_ADDRESS", ErrDeviceFault},
		{Result(4242), "CUresult(4242)", ErrUnknown},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.name, c.r.String())
			assert.Equal(t, c.category, c.r.Category())
		})
	}
	_, ok := ParseResult("CUDA_ERROR_NO_SUCH_THING")
	assert.False(t, ok)
	_, ok = ParseResult("CUresult(x)")
	assert.False(t, ok)
}

func TestGeneratedFilesAreCurrent(t *testing.T) {
	tsv, err := os.ReadFile("results.tsv")
	require.NoError(t, err)
	goSrc, pySrc, err := gen.Generate(tsv)
	require.NoError(t, err)
	onDisk, err := os.ReadFile("results_gen.go")
	require.NoError(t, err)
	assert.Equal(t, string(goSrc), string(onDisk), "results_gen.go is stale: run go generate ./pkg/cuda")
	onDisk, err = os.ReadFile("../../python/cudacore/_results.py")
	require.NoError(t, err)
	assert.Equal(t, string(pySrc), string(onDisk), "_results.py is stale: run go generate ./pkg/cuda")
}

func TestErrorIsCategoryAndWrapping(t *testing.T) {
	err := Check("cuMemAlloc_v2", ErrorOutOfMemory)
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrOutOfMemory)
	assert.NotErrorIs(t, err, ErrInvalidValue)
	assert.Equal(t, "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY: the API call failed because it was unable to allocate enough memory", err.Error())
	assert.NoError(t, Check("cuInit", Success))

	wrapped := &Error{Op: "cudacore.allocate", Result: ErrorOutOfMemory, Msg: "allocate 1.0 TiB", Err: err}
	assert.ErrorIs(t, wrapped, ErrOutOfMemory)
	assert.Equal(t, ErrorOutOfMemory, ResultOf(wrapped))
	assert.Equal(t, Success, ResultOf(nil))
	assert.Equal(t, ErrorUnknown, ResultOf(os.ErrNotExist))
}
