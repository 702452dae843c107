package cuda

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wireExample is one case of testdata/wire_examples.json, which tests/test_errors.py reads too: the
// two sides of the wire format are held to the same examples.
type wireExample struct {
	Wire     string            `json:"wire"`
	Code     int               `json:"code"`
	Name     string            `json:"name"`
	Op       string            `json:"op"`
	Fields   map[string]string `json:"fields"`
	Message  string            `json:"message"`
	Category string            `json:"category"`
}

func loadWireExamples(t *testing.T) []wireExample {
	raw, err := os.ReadFile("testdata/wire_examples.json")
	require.NoError(t, err)
	var ex []wireExample
	require.NoError(t, json.Unmarshal(raw, &ex))
	require.NotEmpty(t, ex)
	return ex
}

func TestDecodeSharedExamples(t *testing.T) {
	for _, ex := range loadWireExamples(t) {
		t.Run(ex.Name, func(t *testing.T) {
			w, ok := Decode(ex.Wire)
			require.True(t, ok)
			assert.Equal(t, Result(ex.Code), w.Result)
			assert.Equal(t, ex.Name, w.Name)
			assert.Equal(t, ex.Op, w.Op)
			assert.Equal(t, ex.Message, w.Message)
			got := map[string]string{}
			for _, f := range w.Fields {
				got[f.Key] = f.Value
			}
			assert.Equal(t, ex.Fields, got)
			cat := w.Result.Category()
			require.NotNil(t, cat)
			assert.Equal(t, "Err"+ex.Category, sentinelName(cat))
		})
	}
}

func sentinelName(err error) string {
	for name, s := range map[string]error{
		"ErrInvalidValue": ErrInvalidValue, "ErrOutOfMemory": ErrOutOfMemory, "ErrCapture": ErrCapture,
		"ErrDriverNotFound": ErrDriverNotFound, "ErrUnknown": ErrUnknown,
	} {
		if s == err {
			return name
		}
	}
	return fmt.Sprint(err)
}

func TestEncode(t *testing.T) {
	oom := &Error{Op: "cuMemAllocAsync", Result: ErrorOutOfMemory, Msg: "allocate 2.0 TiB on device 0",
		Fields: []Field{{"requested", "2199023255552"}, {"free", "84465090560"}}}
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, ""},
		{"driver error", Check("cuInit", ErrorNoDevice),
			"cuda[100 CUDA_ERROR_NO_DEVICE cuInit]: cuInit: CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected"},
		{"fields", oom, "cuda[2 CUDA_ERROR_OUT_OF_MEMORY cuMemAllocAsync]{requested=2199023255552 free=84465090560}: " + oom.Error()},
		{"wrapped keeps the header of the inner error", fmt.Errorf("outer: %w", oom),
			"cuda[2 CUDA_ERROR_OUT_OF_MEMORY cuMemAllocAsync]{requested=2199023255552 free=84465090560}: outer: " + oom.Error()},
		{"plain error is internal", errors.New("boom"), "cuda[-4 CUDACORE_ERROR_INTERNAL cudacore]: boom"},
		{"unsafe op and values are sanitized", &Error{Op: "a b]c", Result: ErrorInvalidValue,
			Fields: []Field{{"Bad Key!", "x y"}, {"", "dropped"}}},
			"cuda[1 CUDA_ERROR_INVALID_VALUE a_b_c]{badkey=x_y}: a b]c: CUDA_ERROR_INVALID_VALUE: " + ErrorInvalidValue.Description()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, Encode(c.err))
		})
	}
}

func TestDecodeRejectsMalformed(t *testing.T) {
	for _, s := range []string{
		"", "boom", "cuda[", "cuda[2 X]: m", "cuda[x NAME op]: m", "cuda[2 NAME op]m", "cuda[2 NAME op]{a=1: m",
		"cuda[2 NAME op]{novalue}: m", "cuda[2 NAME op]{A=1}: m", "cuda[2  op]: m", "cuda[99999999999 N op]: m",
	} {
		_, ok := Decode(s)
		assert.False(t, ok, "%q", s)
	}
}

// FuzzWireRoundTrip: whatever the error, Encode's output decodes back to the same result, op, fields and
// message; and Decode never panics on arbitrary text.
func FuzzWireRoundTrip(f *testing.F) {
	f.Add(int32(2), "cuMemAllocAsync", "allocate", "requested", "1024", "free", "9")
	f.Add(int32(-4), "", "", "", "", "x", "")
	f.Add(int32(906), "op with spaces]", "multi\nline: message", "k", "v v", "a=b", "{}")
	f.Fuzz(func(t *testing.T, code int32, op, msg, k1, v1, k2, v2 string) {
		e := &Error{Op: op, Result: Result(code), Msg: msg, Fields: []Field{{k1, v1}, {k2, v2}}}
		s := Encode(e)
		w, ok := Decode(s)
		require.True(t, ok, "%q", s)
		assert.Equal(t, Result(code), w.Result)
		assert.Equal(t, Result(code).String(), w.Name)
		assert.Equal(t, wireToken(op, "cudacore"), w.Op)
		assert.Equal(t, e.Error(), w.Message)
		var want []Field
		for _, f := range e.Fields {
			if k := wireKey(f.Key); k != "" {
				want = append(want, Field{k, wireToken(f.Value, "-")})
			}
		}
		assert.Equal(t, want, w.Fields)
		_, _ = Decode(msg) // arbitrary text must not panic
		_, _ = Decode("cuda[" + strconv.Itoa(int(code)) + " " + op + "]" + msg)
	})
}
