package doccheck

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// A finding is one reference to something that does not exist.
type finding struct {
	file string // slash-separated, relative to the repository root
	line int
	ref  string
	why  string
}

func (f finding) String() string {
	return fmt.Sprintf("%s:%d: %s: %s", f.file, f.line, f.ref, f.why)
}

// A checker collects findings against one module.
type checker struct {
	m        *module
	quals    map[string]*pkg // qualifier -> package, see module.qualifiers
	modules  []string        // module paths: a go get of one is no package, yet fine
	checked  int             // references checked, found or not
	findings []finding
}

func newChecker(m *module) *checker {
	c := &checker{m: m, quals: m.qualifiers(), modules: []string{modulePath}}
	for _, p := range m.pkgs {
		if p.dir != "." && fileExists(filepath.Join(m.root, filepath.FromSlash(p.dir), "go.mod")) {
			c.modules = append(c.modules, p.path)
		}
	}
	return c
}

func (c *checker) report(file string, line int, ref, format string, args ...any) {
	c.findings = append(c.findings, finding{file: file, line: line, ref: ref, why: fmt.Sprintf(format, args...)})
}

// planned matches the words that let a line name what is not built yet.
var planned = regexp.MustCompile(`(?i)\b(planned|not built yet|not yet built|not yet here)\b`)

// qualified matches pkg.Name and pkg.Type.Member, with the character
// before the qualifier (so that a.memory.New or x/memory.New is not one).
var qualified = regexp.MustCompile(`(^|[^\w./\[*])\*?([a-z][a-z0-9]*)\.([A-Z]\w*)(?:\.([A-Z]\w*))?`)

// checkQualified checks the qualified names in text whose qualifier is a
// sluice package name not in shadow (names imported from elsewhere).
func (c *checker) checkQualified(file string, line int, text string, shadow map[string]bool) {
	for _, sm := range qualified.FindAllStringSubmatch(text, -1) {
		q, name, member := sm[2], sm[3], sm[4]
		p, ok := c.quals[q]
		if !ok || shadow[q] {
			continue
		}
		c.checked++
		ref := q + "." + name
		if !p.has("", name) {
			c.report(file, line, ref, "package %s (%s) has no %s", q, p.path, name)
			continue
		}
		if member != "" && p.types[name] && !p.has(name, member) {
			c.report(file, line, ref+"."+member, "%s.%s has no field or method %s", q, name, member)
		}
	}
}

// importPaths matches the module's import paths, with what follows them,
// and with a :// (a URL) or [ (a doc link, checked as one) before them.
var importPaths = regexp.MustCompile(`(://|\[)?` + regexp.QuoteMeta(modulePath) + `[\w./-]*`)

// shortPaths matches sluice/x, the way prose names a package of sluice.
var shortPaths = regexp.MustCompile(`(^|[^\w./-])sluice/([\w./-]*[\w](/\.\.\.)?)`)

// checkPaths checks the import paths and sluice/x spellings in text.
func (c *checker) checkPaths(file string, line int, text string) {
	for _, sm := range importPaths.FindAllStringSubmatch(text, -1) {
		if sm[1] == "" {
			c.checkPackage(file, line, sm[0], sm[0])
		}
	}
	for _, sm := range shortPaths.FindAllStringSubmatch(text, -1) {
		if !c.isShortName(sm[2]) {
			c.checkPackage(file, line, "sluice/"+sm[2], modulePath+"/"+sm[2])
		}
	}
}

// isShortName reports whether x in sluice/x is the last element of a
// package's path, its go- prefix aside: sluice/redis and sluice/go-redis
// for backend/redis, as labels and error prefixes name the backends.
func (c *checker) isShortName(x string) bool {
	x = strings.TrimPrefix(x, "go-")
	for _, p := range c.m.pkgs {
		if inModule(p.path) && path.Base(p.path) == x {
			return true
		}
	}
	return false
}

// checkPackage checks that ipath, an import path possibly followed by
// .Name, names a package (or one of the modules) that has Name; or, if it
// ends in /..., that some package's path starts with it.
func (c *checker) checkPackage(file string, line int, ref, ipath string) {
	c.checked++
	if prefix, ok := strings.CutSuffix(ipath, "/..."); ok {
		for p := range c.m.pkgs {
			if p == prefix || strings.HasPrefix(p, prefix+"/") {
				return
			}
		}
		c.report(file, line, ref, "no package matches %s/...", prefix)
		return
	}
	ipath = strings.TrimSuffix(strings.TrimRight(ipath, "."), "/")
	var name string
	if i := strings.LastIndex(ipath, "/"); i >= 0 {
		if j := strings.Index(ipath[i:], "."); j >= 0 {
			ipath, name = ipath[:i+j], ipath[i+j+1:]
		}
	}
	ref = strings.TrimRight(strings.TrimRight(ref, "."), "/")
	p, ok := c.m.pkgs[ipath]
	switch {
	case !ok && slices.Contains(c.modules, ipath) && name == "":
	case !ok:
		c.report(file, line, ref, "no package %s", ipath)
	case name == "" || !startsUpper(name):
	case !p.has("", strings.SplitN(name, ".", 2)[0]):
		c.report(file, line, ref, "package %s has no %s", ipath, name)
	}
}

func startsUpper(s string) bool {
	return s != "" && s[0] >= 'A' && s[0] <= 'Z'
}

// pathLike matches a slash-separated relative path.
var pathLike = regexp.MustCompile(`^[\w.*-]+(/[\w.*-]+)*/?$`)

// checkRepoPath checks that tok, a word of code or comment, exists if it is
// a repository path: a slash path whose first element is a directory at the
// repository root, or cmd, or that ends in a slash. It is looked for from
// the repository root and from base, the directory of the module (for a Go
// file) or of the Markdown file it is in.
func (c *checker) checkRepoPath(file string, line int, tok, base string) {
	tok = strings.Trim(tok, "\"'`()[]{},;:")
	tok = strings.TrimRight(tok, ".")
	rel := strings.TrimPrefix(tok, "./")
	rel = strings.TrimSuffix(rel, "/...")
	if rel == "" || rel == "..." || !strings.Contains(rel, "/") || !pathLike.MatchString(rel) ||
		strings.HasPrefix(rel, "sluice/") || strings.HasPrefix(rel, "github.com/") {
		return
	}
	first, _, _ := strings.Cut(rel, "/")
	if !c.m.rootDirs[first] && first != "cmd" && !strings.HasSuffix(rel, "/") {
		return
	}
	c.checked++
	if !c.repoPathExists(rel) && !c.repoPathExists(path.Join(base, rel)) {
		c.report(file, line, tok, "no such file or directory in the repository")
	}
}

func (c *checker) repoPathExists(rel string) bool {
	if strings.HasPrefix(path.Clean(rel), "../") {
		return false
	}
	p := filepath.Join(c.m.root, filepath.FromSlash(path.Clean(rel)))
	if strings.Contains(rel, "*") {
		matches, err := filepath.Glob(p)
		return err == nil && len(matches) > 0
	}
	return fileExists(p)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// words splits code or prose into the tokens a path may be.
func words(text string) []string {
	return strings.FieldsFunc(text, func(r rune) bool {
		return r == ' ' || r == '\t' || r == '|' || r == '=' || r == '<' || r == '>'
	})
}
