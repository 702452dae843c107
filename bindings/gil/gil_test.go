package gil

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fixture is gopy v0.4.8's generated Go for testdata/fixture (see testdata/regen.sh). Its wrappers cover the
// three ways gopy restores the GIL: plain restore after (T, error) and error-only calls, deferred restore
// after single-value calls.
func fixture(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "gopy_v0.4.8_fixture.go.txt"))
	require.NoError(t, err)
	return string(b)
}

// wrapperBody returns the lines of the generated wrapper func fixture_<name>, up to its closing brace.
func wrapperBody(t *testing.T, src, name string) []string {
	t.Helper()
	lines := strings.Split(src, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "func fixture_"+name+"(") {
			for j := i; j < len(lines); j++ {
				if lines[j] == "}" {
					return lines[i : j+1]
				}
			}
		}
	}
	t.Fatalf("no wrapper fixture_%s", name)
	return nil
}

// withoutGIL is src with the _saved_thread lines of the named wrappers removed: what Patch must produce.
func withoutGIL(src string, names ...string) string {
	lines := strings.Split(src, "\n")
	var out []string
	in := ""
	for _, l := range lines {
		if strings.HasPrefix(l, "func fixture_") {
			in = strings.TrimPrefix(l, "func fixture_")
			in = in[:strings.Index(in, "(")]
		}
		drop := false
		for _, n := range names {
			if in == n && strings.Contains(l, "_saved_thread") {
				drop = true
			}
		}
		if l == "}" {
			in = ""
		}
		if !drop {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestPatch(t *testing.T) {
	src := fixture(t)
	all := []string{"Check", "Count", "Label", "Plain"}
	for _, tc := range []struct {
		name string
		hold []string
	}{
		{"all release", nil},
		{"(int, error) held", []string{"Count"}},
		{"(string, error) held", []string{"Label"}},
		{"int only held (deferred restore)", []string{"Plain"}},
		{"error only held", []string{"Check"}},
		{"mixed", []string{"Count", "Plain"}},
		{"all held", all},
	} {
		t.Run(tc.name, func(t *testing.T) {
			policy := map[string]Mode{}
			for _, n := range all {
				policy[n] = Release
			}
			for _, n := range tc.hold {
				policy[n] = Hold
			}
			got, err := Patch([]byte(src), policy)
			require.NoError(t, err)
			assert.Equal(t, withoutGIL(src, tc.hold...), string(got))
			for _, n := range all {
				body := strings.Join(wrapperBody(t, string(got), n), "\n")
				if policy[n] == Hold {
					assert.NotContains(t, body, "_saved_thread", n)
					assert.Contains(t, body, "fixture."+n+"(", n)
				} else {
					assert.Contains(t, body, "_saved_thread := C.PyEval_SaveThread()", n)
					assert.Contains(t, body, "C.PyEval_RestoreThread(_saved_thread)", n)
				}
			}
		})
	}
}

func TestPatchKeepsDeferredRestoreForRelease(t *testing.T) {
	got, err := Patch([]byte(fixture(t)), map[string]Mode{"Plain": Release})
	require.NoError(t, err)
	assert.Contains(t, strings.Join(wrapperBody(t, string(got), "Plain"), "\n"),
		"defer C.PyEval_RestoreThread(_saved_thread)")
}

func TestPatchRejectsUnexpectedShapes(t *testing.T) {
	src := fixture(t)
	countSave := "func fixture_Count(n C.longlong) C.longlong {\n\t_saved_thread := C.PyEval_SaveThread()\n"
	require.Contains(t, src, countSave)
	for _, tc := range []struct {
		name   string
		src    string
		policy map[string]Mode
		want   string
	}{
		{"function not generated", src, map[string]Mode{"Missing": Hold}, "Missing: found 0 gopy wrappers"},
		{"already patched", withoutGIL(src, "Count"), map[string]Mode{"Count": Hold}, "found 0 and 0"},
		{"release checked too", withoutGIL(src, "Count"), map[string]Mode{"Count": Release}, "Count"},
		{"save not alone on its line",
			strings.Replace(src, countSave, "func fixture_Count(n C.longlong) C.longlong {\n\t_saved_thread := C.PyEval_SaveThread(); _ = 1\n", 1),
			map[string]Mode{"Count": Hold}, "holds more than the statement"},
		{"extra use of the saved state",
			strings.Replace(src, countSave, countSave+"\t_ = _saved_thread\n", 1),
			map[string]Mode{"Count": Hold}, "used 3 times"},
		{"unknown mode", src, map[string]Mode{"Count": "maybe"}, `unknown mode "maybe"`},
		{"not Go", "package main\nfunc {", map[string]Mode{"Count": Hold}, "parse generated Go"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Patch([]byte(tc.src), tc.policy)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func writeFacade(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644))
	}
	return dir
}

func TestParse(t *testing.T) {
	dir := writeFacade(t, map[string]string{
		"a.go": `package facade

// Hold is short.
//
//cudacore:gil hold
func Hold() (int, error) { return 0, nil }

// Release waits.
//
//cudacore:gil release
func Release() (int, error) { return 0, nil }

func unexported() {}

type T struct{}

// Method is not a package-level function.
func (T) Method() {}
`,
		"a_test.go":   "package facade\n\nfunc TestX() {}\n",
		"other_os.go": "//go:build plan9\n\npackage facade\n\nfunc PlanNine() {}\n",
	})
	funcs, err := Parse(dir)
	require.NoError(t, err)
	require.Len(t, funcs, 2)
	assert.Equal(t, map[string]Mode{"Hold": Hold, "Release": Release}, Policy(funcs))
	assert.Equal(t, "Hold", funcs[0].Name)
	assert.Equal(t, 6, funcs[0].Pos.Line)
	assert.Equal(t, filepath.Join(dir, "a.go"), funcs[0].Pos.Filename)
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"no doc", "", "F: no doc comment"},
		{"no directive", "// F does things.\n", "F: missing //cudacore:gil directive"},
		{"space after slashes", "// F.\n//\n// cudacore:gil hold\n", `malformed GIL directive "// cudacore:gil hold"`},
		{"unknown mode", "//cudacore:gil keep\n", "malformed GIL directive"},
		{"extra word", "//cudacore:gil hold please\n", "malformed GIL directive"},
		{"two directives", "//cudacore:gil hold\n//cudacore:gil release\n", "2 //cudacore:gil directives"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeFacade(t, map[string]string{"f.go": "package facade\n\n" + tc.doc + "func F() (int, error) { return 0, nil }\n"})
			_, err := Parse(dir)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			// The message names the place: file:line of the func keyword.
			line := strings.Count(tc.doc, "\n") + 3
			assert.Contains(t, err.Error(), filepath.Join(dir, "f.go")+":"+strconv.Itoa(line)+":")
		})
	}
}

func TestManifest(t *testing.T) {
	b, err := Manifest(map[string]Mode{"Noop": Hold, "Alloc": Release})
	require.NoError(t, err)
	assert.Equal(t, "{\n  \"Alloc\": \"release\",\n  \"Noop\": \"hold\"\n}\n", string(b))
}
