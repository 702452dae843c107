package cudacore

import (
	"go/ast"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/bindings/gil"
)

// TestFacadeGILDirectives checks the facade's contract with the build: every exported function has exactly
// one valid //cudacore:gil directive (gil.Parse fails otherwise, naming the function and file:line),
// returns (T, error), the one shape that gopy wraps without leaking and that bindings/gil knows how to
// patch, and runs its body inside guard.
func TestFacadeGILDirectives(t *testing.T) {
	funcs, err := gil.Parse(".")
	require.NoError(t, err)
	require.NotEmpty(t, funcs)

	policy := gil.Policy(funcs)
	assert.Equal(t, gil.Hold, policy["Noop"], "Noop measures the GIL-held crossing")
	assert.Equal(t, gil.Release, policy["NoopReleased"], "NoopReleased measures the GIL-releasing crossing")

	for _, f := range funcs {
		var results []ast.Expr
		if f.Decl.Type.Results != nil {
			for _, field := range f.Decl.Type.Results.List {
				n := max(len(field.Names), 1)
				for range n {
					results = append(results, field.Type)
				}
			}
		}
		if !assert.Lenf(t, results, 2, "%s: %s must return (T, error)", f.Pos, f.Name) {
			continue
		}
		assert.Truef(t, isError(results[1]), "%s: %s: second result must be error", f.Pos, f.Name)
		assert.Falsef(t, isError(results[0]), "%s: %s: first result must be a value, not error", f.Pos, f.Name)
		assert.Truef(t, callsGuard(f.Decl.Body), "%s: %s: its body must run inside guard (a panic would kill the interpreter)", f.Pos, f.Name)
	}
}

// callsGuard says whether body calls guard (guard(...) or guard[T](...)).
func callsGuard(body *ast.BlockStmt) bool {
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		if c, ok := n.(*ast.CallExpr); ok {
			fun := c.Fun
			if ix, ok := fun.(*ast.IndexExpr); ok {
				fun = ix.X
			}
			if id, ok := fun.(*ast.Ident); ok && id.Name == "guard" {
				found = true
			}
		}
		return !found
	})
	return found
}

func isError(e ast.Expr) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == "error"
}
