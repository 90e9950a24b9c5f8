package locks_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestExportedNamesAreDocumented walks the source of the packages an
// embedder programs against, the root package and application, and fails
// for every exported name without a doc comment: functions, methods of
// exported types, types, constants, variables, struct fields and
// interface methods. A function's or a type's comment starts with its
// name, as go doc and pkg.go.dev expect.
func TestExportedNamesAreDocumented(t *testing.T) {
	for _, dir := range []string{".", "application"} {
		fset := token.NewFileSet()
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			for _, missing := range undocumented(f) {
				t.Errorf("%s: exported %s has no doc comment", fset.Position(missing.Pos()), missing.Name)
			}
			for _, bad := range misnamed(f) {
				t.Errorf("%s: the doc comment of %s does not start with its name", fset.Position(bad.Pos()), bad.Name)
			}
		}
	}
}

// undocumented returns the exported names of f that have no doc comment.
func undocumented(f *ast.File) []*ast.Ident {
	var out []*ast.Ident
	need := func(id *ast.Ident, docs ...*ast.CommentGroup) {
		if !id.IsExported() {
			return
		}
		for _, d := range docs {
			if d != nil && strings.TrimSpace(d.Text()) != "" {
				return
			}
		}
		out = append(out, id)
	}
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil || exportedReceiver(d.Recv) {
				need(d.Name, d.Doc)
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					need(s.Name, s.Doc, groupDoc(d))
					if s.Name.IsExported() {
						out = append(out, undocumentedMembers(s.Type)...)
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						need(n, s.Doc, s.Comment, d.Doc)
					}
				}
			}
		}
	}
	return out
}

// groupDoc is a declaration's own doc when it declares one name.
func groupDoc(d *ast.GenDecl) *ast.CommentGroup {
	if d.Lparen.IsValid() {
		return nil
	}
	return d.Doc
}

// undocumentedMembers returns the exported fields of a struct, or methods
// of an interface, that have neither a doc comment nor a line comment.
func undocumentedMembers(expr ast.Expr) []*ast.Ident {
	var fields *ast.FieldList
	switch ty := expr.(type) {
	case *ast.StructType:
		fields = ty.Fields
	case *ast.InterfaceType:
		fields = ty.Methods
	default:
		return nil
	}
	var out []*ast.Ident
	for _, field := range fields.List {
		if field.Doc != nil || field.Comment != nil {
			continue
		}
		for _, n := range field.Names {
			if n.IsExported() {
				out = append(out, n)
			}
		}
	}
	return out
}

func exportedReceiver(recv *ast.FieldList) bool {
	ty := recv.List[0].Type
	if star, ok := ty.(*ast.StarExpr); ok {
		ty = star.X
	}
	if idx, ok := ty.(*ast.IndexExpr); ok {
		ty = idx.X
	}
	id, ok := ty.(*ast.Ident)
	return ok && id.IsExported()
}

// misnamed returns the exported functions and types of f whose doc
// comment does not start with their name (an article before it is fine).
func misnamed(f *ast.File) []*ast.Ident {
	var out []*ast.Ident
	check := func(id *ast.Ident, doc *ast.CommentGroup) {
		if !id.IsExported() || doc == nil {
			return
		}
		text := strings.TrimSpace(doc.Text())
		for _, article := range []string{"A ", "An ", "The "} {
			text = strings.TrimPrefix(text, article)
		}
		if !strings.HasPrefix(text, id.Name) {
			out = append(out, id)
		}
	}
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil || exportedReceiver(d.Recv) {
				check(d.Name, d.Doc)
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				if s, ok := spec.(*ast.TypeSpec); ok {
					doc := s.Doc
					if doc == nil {
						doc = groupDoc(d)
					}
					check(s.Name, doc)
				}
			}
		}
	}
	return out
}
