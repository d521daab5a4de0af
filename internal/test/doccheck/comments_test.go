package doccheck

import (
	"go/ast"
	"go/doc/comment"
	"strings"
)

// docComments returns the doc comments of f: the package comment and those
// of declarations, specs, and struct fields and interface methods.
func docComments(f *ast.File) []*ast.CommentGroup {
	var groups []*ast.CommentGroup
	add := func(g *ast.CommentGroup) {
		if g != nil {
			groups = append(groups, g)
		}
	}
	add(f.Doc)
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncDecl:
			add(n.Doc)
		case *ast.GenDecl:
			add(n.Doc)
		case *ast.TypeSpec:
			add(n.Doc)
		case *ast.ValueSpec:
			add(n.Doc)
		case *ast.Field:
			add(n.Doc)
		}
		return true
	})
	return groups
}

// A commentLine is one line of a comment, without its markers.
type commentLine struct {
	n    int
	text string
}

// lines splits a comment group into its lines, leaving out directives.
func lines(gf goFile, g *ast.CommentGroup) []commentLine {
	var out []commentLine
	for _, cm := range g.List {
		start := gf.fset.Position(cm.Pos()).Line
		if strings.HasPrefix(cm.Text, "//") {
			text := cm.Text[2:]
			if !strings.HasPrefix(text, "go:") && !strings.HasPrefix(text, "line ") {
				out = append(out, commentLine{start, text})
			}
			continue
		}
		text := strings.TrimSuffix(strings.TrimPrefix(cm.Text, "/*"), "*/")
		for i, l := range strings.Split(text, "\n") {
			out = append(out, commentLine{start + i, l})
		}
	}
	return out
}

// checkGoFile checks the doc comments of one Go file.
func (c *checker) checkGoFile(gf goFile) {
	imports := map[string]string{}
	for _, imp := range gf.ast.Imports {
		addImport(imports, imp)
	}
	shadow := map[string]bool{}
	for name, ipath := range gf.pkg.imports {
		if !inModule(ipath) {
			shadow[name] = true
		}
	}
	for name, ipath := range imports {
		if !inModule(ipath) {
			shadow[name] = true
		}
	}
	parser := &comment.Parser{
		LookupPackage: func(name string) (string, bool) { return c.lookupPackage(gf, imports, name) },
		LookupSym:     func(recv, name string) bool { return true }, // checked below
	}
	for _, g := range docComments(gf.ast) {
		ls := lines(gf, g)
		for _, l := range ls {
			if planned.MatchString(l.text) {
				continue
			}
			c.checkQualified(gf.rel, l.n, l.text, shadow)
			c.checkPaths(gf.rel, l.n, l.text)
			for _, w := range words(l.text) {
				c.checkRepoPath(gf.rel, l.n, w, gf.moduleDir)
			}
		}
		c.checkDocLinks(gf, ls, parser.Parse(g.Text()))
	}
}

// lookupPackage resolves the qualifier of a doc link as go doc does: the
// imports (this file's first, for a test file), then the package's own
// name; then, where go doc would find nothing, a sluice package of that
// name. It returns false for the rest, which the comment parser then looks
// up in the standard library.
func (c *checker) lookupPackage(gf goFile, imports map[string]string, name string) (string, bool) {
	if gf.test {
		if ipath, ok := imports[name]; ok {
			return ipath, ipath != ""
		}
	}
	if ipath, ok := gf.pkg.imports[name]; ok {
		return ipath, ipath != ""
	}
	if name == gf.pkg.name {
		return gf.pkg.path, true
	}
	if p, ok := c.quals[name]; ok {
		return p.path, true
	}
	return "", false
}

// checkDocLinks checks each doc link of a parsed comment that points into
// the module.
func (c *checker) checkDocLinks(gf goFile, ls []commentLine, doc *comment.Doc) {
	from := 0 // the comment line to search for the next link from
	for _, link := range docLinks(doc.Content) {
		raw := "[" + plainText(link.Text) + "]"
		line := ls[0].n
		for i := from; i < len(ls); i++ {
			if strings.Contains(ls[i].text, raw) {
				line, from = ls[i].n, i
				break
			}
		}
		ref := strings.Trim(raw, "[]")
		if link.ImportPath == "" || inModule(link.ImportPath) {
			c.checked++
		}
		switch {
		case link.ImportPath == "": // [Name] or [Type.Name]: this package
			ok := gf.pkg.has(link.Recv, link.Name)
			if gf.test {
				ok = gf.pkg.hasInTests(link.Recv, link.Name)
			}
			if !ok {
				c.report(gf.rel, line, raw, "package %s has no %s", gf.pkg.name, ref)
			}
		case !inModule(link.ImportPath):
		default:
			c.checkLink(gf.rel, line, raw, link)
		}
	}
}

// checkLink checks a doc link into another package of the module.
func (c *checker) checkLink(file string, line int, raw string, link *comment.DocLink) {
	p, ok := c.m.pkgs[link.ImportPath]
	switch {
	case !ok:
		c.report(file, line, raw, "no package %s", link.ImportPath)
	case link.Name == "":
	case !p.has(link.Recv, link.Name):
		name := link.Name
		if link.Recv != "" {
			name = link.Recv + "." + name
		}
		c.report(file, line, raw, "package %s (%s) has no %s", p.name, p.path, name)
	}
}

// docLinks returns the doc links in blocks, in order.
func docLinks(blocks []comment.Block) []*comment.DocLink {
	var links []*comment.DocLink
	var inText func([]comment.Text)
	inText = func(ts []comment.Text) {
		for _, t := range ts {
			switch t := t.(type) {
			case *comment.DocLink:
				links = append(links, t)
			case *comment.Link:
				inText(t.Text)
			}
		}
	}
	for _, b := range blocks {
		switch b := b.(type) {
		case *comment.Paragraph:
			inText(b.Text)
		case *comment.Heading:
			inText(b.Text)
		case *comment.List:
			for _, item := range b.Items {
				links = append(links, docLinks(item.Content)...)
			}
		}
	}
	return links
}

func plainText(ts []comment.Text) string {
	var b strings.Builder
	for _, t := range ts {
		switch t := t.(type) {
		case comment.Plain:
			b.WriteString(string(t))
		case comment.Italic:
			b.WriteString(string(t))
		}
	}
	return b.String()
}
