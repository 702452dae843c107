package gen

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The committed outputs are what Go's tables render now: a change to module.ArgCodes, limits or
// stream.HeldCopyMax without `go generate ./cudacore/internal/tablegen` fails here.
func TestGeneratedTablesAreCurrent(t *testing.T) {
	for _, c := range []struct {
		path string
		want []byte
	}{
		{"../../../../python/cudacore/_tables.py", Python()},
		{"../../../native/tables_gen.h", C()},
	} {
		got, err := os.ReadFile(c.path)
		require.NoError(t, err)
		assert.Equal(t, string(c.want), string(got), "%s is stale: run go generate ./cudacore/internal/tablegen", c.path)
	}
}

func TestTheTablesSayWhatGoSays(t *testing.T) {
	py, h := string(Python()), string(C())
	assert.Contains(t, py, `ARG_KINDS: tuple[str, ...] = ("", "i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64", "f16", "f32", "f64", "ptr", "raw")`)
	assert.Contains(t, py, `    "malloc_heap_size",`)
	assert.Contains(t, py, "HELD_COPY_MAX = 65536\n")
	assert.Contains(t, h, "#define CC_ARG_PTR 12\n")
	assert.Contains(t, h, "#define CC_ARG_I8 1\n")
	assert.Contains(t, h, "#define CC_HELD_COPY_MAX 65536\n")
	// The DLPack ABI, rendered for the C producer and the ctypes consumer from the one description.
	assert.Contains(t, h, "#define kDLCUDA 2 ")
	assert.Contains(t, h, "    void (*deleter)(struct DLManagedTensorVersioned *self);\n    uint64_t flags;\n    DLTensor dl_tensor;\n")
	assert.Contains(t, py, "kDLCUDAManaged = 13\n")
	assert.Contains(t, py, `        ("deleter", ctypes.c_void_p),`+"\n"+`        ("flags", ctypes.c_uint64),`+"\n"+`        ("dl_tensor", DLTensor),`)
}
