package entstore

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWriteBodies_KeepNoStateOfTheirOwn reads the source of this package
// and of the adapters that use it: a write body (a function literal given
// to WriteOne or an adapter's writeStatement) may run several times,
// and only its last run counts, so it must return its outcome rather than
// assign a variable of its caller, which a run that was rolled back would
// leave behind for the run that stands (an insert's token, a refusal).
func TestWriteBodies_KeepNoStateOfTheirOwn(t *testing.T) {
	fset := token.NewFileSet()
	bodies := 0
	for _, dir := range []string{".", "../postgres", "../sqlite"} {
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		for _, e := range entries {
			name := e.Name()
			if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
			require.NoError(t, err)
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || !writes[calledName(call.Fun)] {
					return true
				}
				for _, arg := range call.Args {
					if lit, ok := arg.(*ast.FuncLit); ok {
						bodies++
						for _, w := range capturedWrites(lit) {
							assert.Fail(t, "a write body assigns a variable of its caller",
								"%s: %s: return it as the body's outcome instead", fset.Position(w.Pos()), w.Name)
						}
					}
				}
				return true
			})
		}
	}
	assert.GreaterOrEqual(t, bodies, 7, "the write bodies were not found: the check checks nothing")
}

// writes are the functions that run write bodies.
var writes = map[string]bool{"WriteOne": true, "writeStatement": true}

// calledName is the name of the function that fun calls: f, pkg.f, f[T].
func calledName(fun ast.Expr) string {
	switch f := fun.(type) {
	case *ast.Ident:
		return f.Name
	case *ast.SelectorExpr:
		return f.Sel.Name
	case *ast.IndexExpr:
		return calledName(f.X)
	}
	return ""
}

// capturedWrites returns the identifiers that lit assigns (as a whole, or
// a field or element of) without declaring them inside lit.
func capturedWrites(lit *ast.FuncLit) []*ast.Ident {
	declared := map[string]bool{}
	for _, fields := range []*ast.FieldList{lit.Type.Params, lit.Type.Results} {
		if fields == nil {
			continue
		}
		for _, f := range fields.List {
			for _, n := range f.Names {
				declared[n.Name] = true
			}
		}
	}
	// Names declared anywhere inside lit count as its own: the check is
	// about the caller's variables, which a body never needs to declare
	// again.
	ast.Inspect(lit.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			if n.Tok == token.DEFINE {
				for _, l := range n.Lhs {
					if id, ok := l.(*ast.Ident); ok {
						declared[id.Name] = true
					}
				}
			}
		case *ast.ValueSpec:
			for _, id := range n.Names {
				declared[id.Name] = true
			}
		case *ast.RangeStmt:
			if n.Tok == token.DEFINE {
				for _, e := range []ast.Expr{n.Key, n.Value} {
					if id, ok := e.(*ast.Ident); ok {
						declared[id.Name] = true
					}
				}
			}
		}
		return true
	})
	var out []*ast.Ident
	check := func(e ast.Expr) {
		if id := root(e); id != nil && id.Name != "_" && !declared[id.Name] {
			out = append(out, id)
		}
	}
	ast.Inspect(lit.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			if n.Tok != token.DEFINE {
				for _, l := range n.Lhs {
					check(l)
				}
			}
		case *ast.IncDecStmt:
			check(n.X)
		case *ast.UnaryExpr:
			// &x handed to a call (Scan) writes x.
			if n.Op == token.AND {
				check(n.X)
			}
		}
		return true
	})
	return out
}

// root is the variable that e names or selects from: x in x, x.f, x[i],
// *x.
func root(e ast.Expr) *ast.Ident {
	for {
		switch x := e.(type) {
		case *ast.Ident:
			return x
		case *ast.SelectorExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.StarExpr:
			e = x.X
		case *ast.ParenExpr:
			e = x.X
		default:
			return nil
		}
	}
}
