package gil

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStub(t *testing.T) {
	dir := t.TempDir()
	src := `package facade

// Count returns how many. More words here.
//
//cudacore:gil hold
func Count(ordinal int, name string, on bool) (int, error) { return 0, nil }

// Name is a name.
//
//cudacore:gil release
func Name() (string, error) { return "", nil }
`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "f.go"), []byte(src), 0o644))
	funcs, err := Parse(dir)
	require.NoError(t, err)
	stub, err := Stub("facade", funcs)
	require.NoError(t, err)
	assert.Contains(t, string(stub), "def Count(ordinal: int, name: str, on: bool) -> int:\n    \"Count returns how many.\"\n    ...")
	assert.Contains(t, string(stub), "def Name() -> str:")

	bad := "package facade\n\n// X.\n//\n//cudacore:gil hold\nfunc X(p []int) (int, error) { return 0, nil }\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "f.go"), []byte(bad), 0o644))
	funcs, err = Parse(dir)
	require.NoError(t, err)
	_, err = Stub("facade", funcs)
	assert.ErrorContains(t, err, "not a basic type")
}

// The real facade must always have a stub: every signature maps.
func TestFacadeStub(t *testing.T) {
	funcs, err := Parse("../../cudacore")
	require.NoError(t, err)
	stub, err := Stub("cudacore", funcs)
	require.NoError(t, err)
	assert.Contains(t, string(stub), "def Noop(x: int) -> int:")
}
