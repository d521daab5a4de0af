package redischeck_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const modulePath = "github.com/sluicehq/sluice"

// backends are the packages whose Check returns a Report, relative to the
// module's root.
var backends = []string{"backend/redis", "backend/rueidis"}

// TestBackendsDocumentTheirTypes reads the backends' source as go doc does:
// Report and Server must lead go doc to a struct whose every field is
// documented (declared there, or an alias of a public package's type), and
// Option's declaration must name no internal package, which a user can
// neither read with go doc nor import.
func TestBackendsDocumentTheirTypes(t *testing.T) {
	for _, dir := range backends {
		t.Run(dir, func(t *testing.T) {
			p := parse(t, dir)
			for _, name := range []string{"Report", "Server"} {
				spec := p.typeSpec(t, name)
				if err := p.documentedStruct(t, spec); err != "" {
					t.Errorf("%s.%s: %s", dir, name, err)
				}
			}
			spec := p.typeSpec(t, "Option")
			for _, path := range p.importsIn(spec.Type) {
				if internal(path) {
					t.Errorf("%s.Option is declared with %s, an internal package", dir, path)
				}
			}
		})
	}
}

// A pkg is one package's non-test files, parsed.
type pkg struct {
	dir   string
	files []*ast.File
}

func parse(t *testing.T, dir string) pkg {
	t.Helper()
	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join("..", "..", filepath.FromSlash(dir), "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	p := pkg{dir: dir}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		p.files = append(p.files, f)
	}
	if len(p.files) == 0 {
		t.Fatalf("no Go files in %s", dir)
	}
	return p
}

// typeSpec finds the declaration of the type name, with the doc comment
// of its declaration when the spec has none of its own.
func (p pkg) typeSpec(t *testing.T, name string) *ast.TypeSpec {
	t.Helper()
	for _, f := range p.files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, s := range g.Specs {
				if s := s.(*ast.TypeSpec); s.Name.Name == name {
					if s.Doc == nil && len(g.Specs) == 1 {
						s.Doc = g.Doc
					}
					return s
				}
			}
		}
	}
	t.Fatalf("%s declares no type %s", p.dir, name)
	return nil
}

// documentedStruct says what is wrong with spec, or "": it must be
// documented and be a struct whose every field is, or name one in a
// public package of the module.
func (p pkg) documentedStruct(t *testing.T, spec *ast.TypeSpec) string {
	if spec.Doc == nil {
		return "no doc comment"
	}
	switch typ := spec.Type.(type) {
	case *ast.StructType:
		for _, f := range typ.Fields.List {
			if f.Doc == nil && f.Comment == nil {
				return "a field without a doc comment"
			}
		}
		return ""
	case *ast.SelectorExpr:
		path := p.importsIn(typ)[0]
		if internal(path) {
			return "declared as " + path + "." + typ.Sel.Name + ", which go doc does not show, in an internal package"
		}
		dir, ok := strings.CutPrefix(path, modulePath+"/")
		if !ok {
			return "declared as a type of " + path + ", outside the module"
		}
		target := parse(t, dir)
		if err := target.documentedStruct(t, target.typeSpec(t, typ.Sel.Name)); err != "" {
			return path + "." + typ.Sel.Name + ": " + err
		}
		return ""
	}
	return "not a struct"
}

// importsIn returns the import paths of the packages that expr names.
func (p pkg) importsIn(expr ast.Expr) []string {
	var paths []string
	ast.Inspect(expr, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if x, ok := sel.X.(*ast.Ident); ok {
			if path := p.importPath(x.Name); path != "" {
				paths = append(paths, path)
			}
		}
		return true
	})
	return paths
}

// importPath is the path a file of p imports under name, or "".
func (p pkg) importPath(name string) string {
	for _, f := range p.files {
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			local := path[strings.LastIndex(path, "/")+1:]
			if imp.Name != nil {
				local = imp.Name.Name
			}
			if local == name {
				return path
			}
		}
	}
	return ""
}

func internal(path string) bool {
	return strings.Contains(path+"/", "/internal/")
}
