package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// targetPlatform names the extension as the target's CPython imports it, and refuses what it cannot build.
func TestTargetPlatform(t *testing.T) {
	for _, tc := range []struct {
		name, platform, multiarch, suffix string
		goarch, want, err                 string
	}{
		{name: "native x86-64", platform: "linux-x86_64", multiarch: "x86_64-linux-gnu",
			suffix: ".cpython-312-x86_64-linux-gnu.so", goarch: "amd64", want: ".cpython-312-x86_64-linux-gnu.so"},
		{name: "native aarch64", platform: "linux-aarch64", multiarch: "aarch64-linux-gnu",
			suffix: ".cpython-313-aarch64-linux-gnu.so", goarch: "arm64", want: ".cpython-313-aarch64-linux-gnu.so"},
		{name: "x86-64 to aarch64", platform: "linux-aarch64", multiarch: "x86_64-linux-gnu",
			suffix: ".cpython-312-x86_64-linux-gnu.so", goarch: "arm64", want: ".cpython-312-aarch64-linux-gnu.so"},
		{name: "aarch64 to x86-64", platform: "linux-x86_64", multiarch: "aarch64-linux-gnu",
			suffix: ".cpython-310-aarch64-linux-gnu.so", goarch: "amd64", want: ".cpython-310-x86_64-linux-gnu.so"},
		{name: "unknown platform", platform: "linux-riscv64", multiarch: "x86_64-linux-gnu",
			suffix: ".cpython-312-x86_64-linux-gnu.so", err: `cannot build for platform "linux-riscv64": cudacore builds for linux-aarch64, linux-x86_64`},
		{name: "macOS", platform: "macosx-11.0-arm64", multiarch: "darwin",
			suffix: ".cpython-312-darwin.so", err: `cannot build for platform "macosx-11.0-arm64"`},
		{name: "cross without a triplet", platform: "linux-aarch64", multiarch: "",
			suffix: ".so", err: `EXT_SUFFIX ".so" does not end in the interpreter's triplet ""`},
		{name: "cross with another triplet in the suffix", platform: "linux-aarch64", multiarch: "x86_64-linux-gnu",
			suffix: ".cpython-312-x86_64-linux-musl.so", err: `does not end in the interpreter's triplet "x86_64-linux-gnu"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			goarch, suffix, err := targetPlatform(tc.platform, tc.multiarch, tc.suffix)
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.goarch, goarch)
			assert.Equal(t, tc.want, suffix)
		})
	}
}

// withoutRunpath keeps the link flags but the run-time search paths of the build machine.
func TestWithoutRunpath(t *testing.T) {
	for _, tc := range []struct {
		name        string
		flags, want []string
	}{
		{name: "pyenv", flags: []string{"-shared", "-L/root/.pyenv/versions/3.12.1/lib", "-Wl,-rpath,/root/.pyenv/versions/3.12.1/lib"},
			want: []string{"-shared", "-L/root/.pyenv/versions/3.12.1/lib"}},
		{name: "other spellings", flags: []string{"-Wl,-rpath=/opt/py/lib", "-Wl,-R/opt/py/lib", "-Wl,-O1"}, want: []string{"-Wl,-O1"}},
		{name: "none", flags: []string{"-shared"}, want: []string{"-shared"}},
		{name: "empty", flags: nil, want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]string(nil), tc.flags...)
			assert.Equal(t, tc.want, withoutRunpath(in))
			assert.Equal(t, tc.flags, in, "the caller's slice is left alone")
		})
	}
}

// cgoWithoutRunpath edits only the #cgo LDFLAGS lines of gopy's generated file.
func TestCgoWithoutRunpath(t *testing.T) {
	src := "package main\n\n/*\n#cgo CFLAGS: -I/py/include -Wl,-rpath,/not/a/link/flag\n" +
		"#cgo LDFLAGS: -shared -L/py/lib -Wl,-rpath,/py/lib -L/py/lib -Wl,-rpath,/py/lib\n" +
		"#cgo LDFLAGS: -Wl,-rpath,/only\n*/\nimport \"C\"\n"
	want := "package main\n\n/*\n#cgo CFLAGS: -I/py/include -Wl,-rpath,/not/a/link/flag\n" +
		"#cgo LDFLAGS: -shared -L/py/lib -L/py/lib\n" +
		"#cgo LDFLAGS:\n*/\nimport \"C\"\n"
	assert.Equal(t, want, string(cgoWithoutRunpath([]byte(src))))
}
