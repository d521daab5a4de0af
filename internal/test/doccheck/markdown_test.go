package doccheck

import (
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"unicode"
)

// markdownFiles returns the Markdown files to check, relative to root:
// all but the raw outputs under docs/results/ and benchmarks/results/.
func markdownFiles(root string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := filepath.ToSlash(mustRel(root, p))
		if d.IsDir() {
			if skipDir(rel) || rel == "docs/results" || rel == "benchmarks/results" {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(rel, ".md") {
			files = append(files, rel)
		}
		return nil
	})
	return files, err
}

// checkMarkdownFile reads and checks one Markdown file.
func (c *checker) checkMarkdownFile(rel string) error {
	data, err := os.ReadFile(filepath.Join(c.m.root, filepath.FromSlash(rel)))
	if err != nil {
		return err
	}
	c.checkMarkdown(rel, string(data))
	return nil
}

var (
	fence      = regexp.MustCompile("^\\s*(```+|~~~+)\\s*(\\w*)")
	mdLink     = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	mdLinkDef  = regexp.MustCompile(`^\s*\[[^\]]+\]:\s*(\S+)`)
	goImport   = regexp.MustCompile(`^\s*(?:import\s+)?(?:(\w+)\s+)?"([^"]+)"`)
	typeMember = regexp.MustCompile(`^\*?([A-Z]\w*)\.([A-Z]\w*)(\(.*\))?$`)
	// sluiceName matches the spans that can only be sluice's names.
	sluiceName = regexp.MustCompile(`^((?:Err|With|Default)[A-Z]\w*)(\(.*\))?$`)
)

// checkMarkdown checks the Markdown text of the file rel.
func (c *checker) checkMarkdown(rel, text string) {
	var (
		inFence bool
		marker  string          // the open fence's backticks or tildes
		shadow  map[string]bool // names a code block imports from elsewhere
	)
	lines := strings.Split(text, "\n")
	foreign := c.foreignTypes(lines)
	for i, line := range lines {
		n := i + 1
		if planned.MatchString(line) {
			continue
		}
		if sm := fence.FindStringSubmatch(line); sm != nil && (!inFence || strings.HasPrefix(strings.TrimSpace(line), marker)) {
			inFence = !inFence
			marker, shadow = sm[1], map[string]bool{}
			continue
		}
		c.checkQualified(rel, n, line, shadow)
		c.checkPaths(rel, n, line)
		if inFence {
			c.shadowImports(line, shadow)
			for _, w := range words(line) {
				c.checkRepoPath(rel, n, w, path.Dir(rel))
			}
			continue
		}
		for _, span := range codeSpans(line) {
			c.checkSpan(rel, n, span, foreign)
		}
		c.checkLinks(rel, n, line)
	}
}

// shadowImports adds to shadow the sluice package names that an import
// line of a code block takes for another library's package.
func (c *checker) shadowImports(line string, shadow map[string]bool) {
	sm := goImport.FindStringSubmatch(line)
	if sm == nil || inModule(sm[2]) {
		return
	}
	name := sm[1]
	if name == "" {
		name = importName(sm[2])
	}
	shadow[name] = true
}

// foreignTypes returns the names that lines qualify with another library's
// package name (Options, for redis.Options): in that file, an unqualified
// Options.Field may mean that type.
func (c *checker) foreignTypes(lines []string) map[string]bool {
	foreign := map[string]bool{}
	for _, line := range lines {
		for _, sm := range qualified.FindAllStringSubmatch(line, -1) {
			if _, ok := c.quals[sm[2]]; !ok {
				foreign[sm[3]] = true
			}
		}
	}
	return foreign
}

// checkSpan checks one inline code span; foreign holds the type names
// that may be another library's.
func (c *checker) checkSpan(rel string, line int, span string, foreign map[string]bool) {
	for _, w := range words(span) {
		c.checkRepoPath(rel, line, w, path.Dir(rel))
	}
	if testFunc.MatchString(span) {
		c.checked++
		if !c.m.tests[span] {
			c.report(rel, line, span, "no such test, benchmark, fuzz or example function in the module")
		}
	}
	if sm := sluiceName.FindStringSubmatch(span); sm != nil && !foreign[sm[1]] {
		c.checkAnyPackage(rel, line, sm[1])
	}
	sm := typeMember.FindStringSubmatch(span)
	if sm == nil || !c.m.types[sm[1]] || foreign[sm[1]] {
		return
	}
	c.checked++
	for _, p := range c.m.pkgs {
		if p.types[sm[1]] && p.has(sm[1], sm[2]) {
			return
		}
	}
	c.report(rel, line, sm[1]+"."+sm[2], "no sluice type %s has a field or method %s", sm[1], sm[2])
}

// checkAnyPackage checks that some package of the module declares name,
// as a top-level name or a method or field.
func (c *checker) checkAnyPackage(rel string, line int, name string) {
	c.checked++
	for _, p := range c.m.pkgs {
		if p.has("", name) {
			return
		}
		for sym := range p.syms {
			if strings.HasSuffix(sym, "."+name) {
				return
			}
		}
	}
	c.report(rel, line, name, "no package of the module declares %s", name)
}

// codeSpans returns the contents of the inline code spans in line.
func codeSpans(line string) []string {
	var spans []string
	for i := 0; i < len(line); {
		if line[i] != '`' {
			i++
			continue
		}
		j := i
		for j < len(line) && line[j] == '`' {
			j++
		}
		ticks := line[i:j]
		end := strings.Index(line[j:], ticks)
		if end < 0 {
			break
		}
		spans = append(spans, strings.TrimSpace(line[j:j+end]))
		i = j + end + len(ticks)
	}
	return spans
}

// checkLinks checks the relative link targets in line: the file must
// exist and, for a Markdown file, a #fragment must name one of its headings.
func (c *checker) checkLinks(rel string, line int, text string) {
	var targets []string
	for _, sm := range mdLink.FindAllStringSubmatch(text, -1) {
		targets = append(targets, sm[1])
	}
	if sm := mdLinkDef.FindStringSubmatch(text); sm != nil {
		targets = append(targets, sm[1])
	}
	for _, t := range targets {
		if strings.Contains(t, "://") || strings.HasPrefix(t, "mailto:") {
			continue
		}
		file, frag, _ := strings.Cut(t, "#")
		target := rel
		c.checked++
		if file != "" {
			target = path.Join(path.Dir(rel), file)
			if !c.repoPathExists(target) {
				c.report(rel, line, t, "link to a file that does not exist")
				continue
			}
		}
		if frag == "" || !strings.HasSuffix(target, ".md") {
			continue
		}
		anchors, err := c.anchors(target)
		if err == nil && !anchors[frag] {
			c.report(rel, line, t, "%s has no heading #%s", target, frag)
		}
	}
}

// anchors returns the fragment names of a Markdown file's headings, as
// GitHub makes them.
func (c *checker) anchors(rel string) (map[string]bool, error) {
	data, err := os.ReadFile(filepath.Join(c.m.root, filepath.FromSlash(rel)))
	if err != nil {
		return nil, err
	}
	anchors := map[string]bool{}
	seen := map[string]int{}
	inFence := false
	for _, line := range strings.Split(string(data), "\n") {
		if fence.MatchString(line) {
			inFence = !inFence
			continue
		}
		t := strings.TrimLeft(line, "#")
		if inFence || t == line || len(line)-len(t) > 6 || !strings.HasPrefix(t, " ") {
			continue
		}
		slug := slugify(t)
		if k := seen[slug]; k > 0 {
			anchors[slug+"-"+strconv.Itoa(k)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	return anchors, nil
}

var linkText = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

// slugify turns a heading into its anchor: links replaced by their text,
// lower case, punctuation but - and _ dropped, spaces made hyphens.
func slugify(heading string) string {
	heading = linkText.ReplaceAllString(strings.TrimSpace(heading), "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
