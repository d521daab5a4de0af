package doccheck

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// modulePath is the import path of the module whose docs are checked.
const modulePath = "github.com/sluicehq/sluice"

// foreignNames are package names of other libraries that the docs use as
// qualifiers (go-redis is package redis, rueidis is rueidis, x/time/rate is
// rate). Should a sluice package ever take one of them, a qualified name
// with it is still not checked: it could mean either.
var foreignNames = []string{"redis", "rueidis", "rate"}

// A pkg is one package of the module, as parsed from its directory.
type pkg struct {
	path string // import path
	dir  string // slash-separated, relative to the repository root
	name string
	// syms holds the exported names, and the exported members of exported
	// types as "Type.Member": what other packages can name.
	syms map[string]bool
	// types holds the exported type names.
	types map[string]bool
	// testSyms holds what the package's test files declare, exported or
	// not, for the doc links of test files.
	testSyms map[string]bool
	// open holds the types with members this check cannot list (a type
	// that embeds another package's type): any Type.Member passes.
	open map[string]bool
	// aliases maps a type declared as another package's type (type Report
	// = redischeck.Report) to that package's name and the type's name.
	aliases map[string][2]string
	// imports maps each name that the package's non-test files import
	// under to its path; "" when two paths share a name.
	imports map[string]string
}

func (p *pkg) has(recv, name string) bool {
	if recv == "" {
		return p.syms[name]
	}
	return p.syms[recv+"."+name] || (p.types[recv] && p.open[recv])
}

// hasInTests is has for a doc link in a test file, which may also name
// what the test files declare.
func (p *pkg) hasInTests(recv, name string) bool {
	key := name
	if recv != "" {
		key = recv + "." + name
	}
	return p.has(recv, name) || p.testSyms[key]
}

// A module is every package of the repository, both Go modules.
type module struct {
	root     string
	pkgs     map[string]*pkg   // by import path
	byName   map[string][]*pkg // by package name, package main left out
	types    map[string]bool   // exported type names of every package
	tests    map[string]bool   // Test, Benchmark, Fuzz and Example functions
	rootDirs map[string]bool   // directories at the repository root
	files    []goFile          // every .go file, for the comment check
}

// A goFile is one parsed Go file.
type goFile struct {
	rel  string // slash-separated, relative to the root
	pkg  *pkg   // the package it belongs to (for a _test package, the one it tests)
	test bool
	// moduleDir is the directory of its go.mod, relative to the root.
	moduleDir string
	ast       *ast.File
	fset      *token.FileSet
}

// findRoot returns the directory of the go.mod that declares modulePath,
// searching up from the working directory.
func findRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if mod, err := modPath(filepath.Join(dir, "go.mod")); err == nil && mod == modulePath {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod for %s above the working directory", modulePath)
		}
		dir = parent
	}
}

func modPath(gomod string) (string, error) {
	data, err := os.ReadFile(gomod)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`), nil
		}
	}
	return "", errors.New(gomod + ": no module line")
}

// skipDir reports whether the walk leaves out a directory: hidden ones,
// testdata, and make bench's output directory.
func skipDir(rel string) bool {
	base := path.Base(rel)
	return rel != "." && (strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_") ||
		base == "testdata" || rel == "bench")
}

// loadModule parses every Go package under root.
func loadModule(root string) (*module, error) {
	m := &module{
		root:     root,
		pkgs:     map[string]*pkg{},
		byName:   map[string][]*pkg{},
		types:    map[string]bool{},
		tests:    map[string]bool{},
		rootDirs: map[string]bool{},
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.IsDir() && !skipDir(e.Name()) {
			m.rootDirs[e.Name()] = true
		}
	}
	mods := map[string]string{".": modulePath} // directory -> module path
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		rel := filepath.ToSlash(mustRel(root, p))
		if skipDir(rel) {
			return filepath.SkipDir
		}
		if mp, err := modPath(filepath.Join(p, "go.mod")); err == nil {
			mods[rel] = mp
		}
		return m.loadDir(rel, importPath(mods, rel), moduleDir(mods, rel))
	})
	if err != nil {
		return nil, err
	}
	for _, p := range m.pkgs {
		if p.name != "main" {
			m.byName[p.name] = append(m.byName[p.name], p)
		}
	}
	m.resolveAliases()
	return m, nil
}

// resolveAliases gives each type declared as another package's type the
// members of that type, if it is the module's; the others are open. Four
// rounds let an alias of an alias (of an alias) get its members too.
func (m *module) resolveAliases() {
	for range 4 {
		for _, p := range m.pkgs {
			for typ, target := range p.aliases {
				t, ok := m.pkgs[p.imports[target[0]]]
				if !ok {
					p.open[typ] = true
					continue
				}
				prefix := target[1] + "."
				for sym := range t.syms {
					if member, ok := strings.CutPrefix(sym, prefix); ok {
						p.syms[typ+"."+member] = true
					}
				}
				if t.open[target[1]] {
					p.open[typ] = true
				}
			}
		}
	}
}

func mustRel(root, p string) string {
	rel, err := filepath.Rel(root, p)
	if err != nil {
		panic(err) // p comes from walking root
	}
	return rel
}

// importPath returns the import path of the directory rel, from the
// innermost module that holds it.
func importPath(mods map[string]string, rel string) string {
	for dir := rel; ; dir = path.Dir(dir) {
		if mp, ok := mods[dir]; ok {
			if dir == rel {
				return mp
			}
			if dir == "." {
				return mp + "/" + rel
			}
			return mp + "/" + strings.TrimPrefix(rel, dir+"/")
		}
	}
}

// moduleDir returns the directory of the innermost module that holds rel.
func moduleDir(mods map[string]string, rel string) string {
	for dir := rel; ; dir = path.Dir(dir) {
		if _, ok := mods[dir]; ok {
			return dir
		}
	}
}

// loadDir parses the .go files in the directory rel, if any.
func (m *module) loadDir(rel, ipath, modDir string) error {
	names, err := filepath.Glob(filepath.Join(m.root, filepath.FromSlash(rel), "*.go"))
	if err != nil || len(names) == 0 {
		return err
	}
	slices.Sort(names)
	fset := token.NewFileSet()
	p := &pkg{path: ipath, dir: rel, syms: map[string]bool{}, types: map[string]bool{},
		testSyms: map[string]bool{}, open: map[string]bool{}, imports: map[string]string{},
		aliases: map[string][2]string{}}
	var decls, testDecls []*ast.File
	for _, name := range names {
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		test := strings.HasSuffix(name, "_test.go")
		m.files = append(m.files, goFile{rel: path.Join(rel, filepath.Base(name)), pkg: p, test: test, moduleDir: modDir, ast: f, fset: fset})
		if test {
			testDecls = append(testDecls, f)
			continue
		}
		p.name = f.Name.Name
		decls = append(decls, f)
		for _, imp := range f.Imports {
			addImport(p.imports, imp)
		}
	}
	if p.name == "" { // tests only
		p.name = strings.TrimSuffix(testDecls[0].Name.Name, "_test")
	}
	collectSyms(p, decls)
	for name := range p.syms {
		if !strings.Contains(name, ".") && typeSpec(decls, name) != nil {
			p.types[name] = true
			m.types[name] = true
		}
	}
	tests := &pkg{syms: p.testSyms, types: map[string]bool{}, open: map[string]bool{}}
	collectSyms(tests, testDecls)
	for _, f := range testDecls {
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && testFunc.MatchString(fn.Name.Name) {
				m.tests[fn.Name.Name] = true
			}
		}
	}
	m.pkgs[ipath] = p
	return nil
}

// testFunc matches the names of the functions go test runs.
var testFunc = regexp.MustCompile(`^(Test|Benchmark|Fuzz|Example)([A-Z_]\w*)?$`)

// addImport records the name imp is imported under.
func addImport(imports map[string]string, imp *ast.ImportSpec) {
	ipath, err := strconv.Unquote(imp.Path.Value)
	if err != nil {
		return
	}
	name := importName(ipath)
	if imp.Name != nil {
		name = imp.Name.Name
	}
	if name == "_" || name == "." {
		return
	}
	if old, ok := imports[name]; ok && old != ipath {
		imports[name] = ""
		return
	}
	imports[name] = ipath
}

// importName guesses the package name of an import path without loading
// it: the last element, without a major-version suffix or a go- prefix
// (github.com/redis/go-redis/v9 is package redis).
func importName(ipath string) string {
	elems := strings.Split(ipath, "/")
	name := elems[len(elems)-1]
	if len(elems) > 1 && len(name) > 1 && name[0] == 'v' && strings.Trim(name[1:], "0123456789") == "" {
		name = elems[len(elems)-2]
	}
	name = strings.TrimPrefix(name, "go-")
	return strings.ReplaceAll(name, "-", "_")
}

// typeSpec returns the declaration of the type name in files, if any.
func typeSpec(files []*ast.File, name string) *ast.TypeSpec {
	for _, f := range files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, s := range g.Specs {
				if ts := s.(*ast.TypeSpec); ts.Name.Name == name {
					return ts
				}
			}
		}
	}
	return nil
}

// collectSyms fills p.syms and p.open from the package's non-test files.
func collectSyms(p *pkg, files []*ast.File) {
	members := map[string]map[string]bool{} // type -> its own exported members
	embeds := map[string][]string{}         // type -> in-package types it embeds
	for _, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					addExported(p.syms, d.Name.Name)
					continue
				}
				recv := recvName(d.Recv.List[0].Type)
				if ast.IsExported(d.Name.Name) {
					addMember(members, recv, d.Name.Name)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.ValueSpec:
						for _, n := range s.Names {
							addExported(p.syms, n.Name)
						}
					case *ast.TypeSpec:
						addExported(p.syms, s.Name.Name)
						collectFields(p, members, embeds, s)
					}
				}
			}
		}
	}
	for typ := range members {
		if !ast.IsExported(typ) {
			continue
		}
		seen := map[string]bool{}
		var promote func(t string)
		promote = func(t string) {
			if seen[t] {
				return
			}
			seen[t] = true
			for name := range members[t] {
				p.syms[typ+"."+name] = true
			}
			for _, e := range embeds[t] {
				promote(e)
			}
			if p.open[t] {
				p.open[typ] = true
			}
		}
		promote(typ)
	}
}

func addExported(syms map[string]bool, name string) {
	if ast.IsExported(name) {
		syms[name] = true
	}
}

func addMember(members map[string]map[string]bool, typ, name string) {
	if members[typ] == nil {
		members[typ] = map[string]bool{}
	}
	members[typ][name] = true
}

// collectFields records the fields of a struct type and the methods of an
// interface type, and what each embeds.
func collectFields(p *pkg, members map[string]map[string]bool, embeds map[string][]string, s *ast.TypeSpec) {
	typ := s.Name.Name
	if members[typ] == nil {
		members[typ] = map[string]bool{}
	}
	var list *ast.FieldList
	switch t := embedded(s.Type).(type) {
	case *ast.StructType:
		list = t.Fields
	case *ast.InterfaceType:
		list = t.Methods
	case *ast.Ident: // type T = U or type T U: U's members, more or less
		embeds[typ] = append(embeds[typ], t.Name)
		return
	case *ast.SelectorExpr: // another package's type
		if p.aliases != nil {
			if x, ok := t.X.(*ast.Ident); ok {
				p.aliases[typ] = [2]string{x.Name, t.Sel.Name}
				return
			}
		}
		p.open[typ] = true
		return
	default:
		return
	}
	for _, field := range list.List {
		for _, n := range field.Names {
			if ast.IsExported(n.Name) {
				members[typ][n.Name] = true
			}
		}
		if len(field.Names) > 0 {
			continue
		}
		switch e := embedded(field.Type).(type) {
		case *ast.Ident: // a type of this package
			if ast.IsExported(e.Name) {
				members[typ][e.Name] = true
			}
			embeds[typ] = append(embeds[typ], e.Name)
		case *ast.SelectorExpr: // another package's type
			members[typ][e.Sel.Name] = true
			p.open[typ] = true
		default: // a union or other constraint term
		}
	}
}

// embedded strips pointers and type arguments from an embedded field's type.
func embedded(e ast.Expr) ast.Expr {
	for {
		switch t := e.(type) {
		case *ast.StarExpr:
			e = t.X
		case *ast.IndexExpr:
			e = t.X
		case *ast.IndexListExpr:
			e = t.X
		default:
			return e
		}
	}
}

func recvName(e ast.Expr) string {
	if id, ok := embedded(e).(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// qualifiers returns the package names that name one sluice package and
// no other library's: the names a qualified reference is checked for.
func (m *module) qualifiers() map[string]*pkg {
	q := map[string]*pkg{}
	for name, ps := range m.byName {
		if len(ps) == 1 && !slices.Contains(foreignNames, name) {
			q[name] = ps[0]
		}
	}
	return q
}

// inModule reports whether an import path is the module's or under it.
func inModule(ipath string) bool {
	return ipath == modulePath || strings.HasPrefix(ipath, modulePath+"/")
}
