package doccheck

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

var (
	loadOnce  sync.Once
	loaded    *module
	errLoaded error
)

// theModule parses the repository once for all the tests.
func theModule(t *testing.T) *module {
	t.Helper()
	loadOnce.Do(func() {
		root, err := findRoot()
		if err != nil {
			errLoaded = err
			return
		}
		loaded, errLoaded = loadModule(root)
	})
	if errLoaded != nil {
		t.Fatal(errLoaded)
	}
	return loaded
}

// selfDir is this package's directory, whose comments describe the
// check with made-up names.
const selfDir = "internal/test/doccheck"

// TestDocs checks every Markdown file and every Go doc comment of the
// repository: each package, identifier and path they name must exist.
func TestDocs(t *testing.T) {
	m := theModule(t)
	c := newChecker(m)
	files, err := markdownFiles(m.root)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if err := c.checkMarkdownFile(f); err != nil {
			t.Fatal(err)
		}
	}
	for _, gf := range m.files {
		if gf.pkg.dir != selfDir { // names what does not exist, on purpose
			c.checkGoFile(gf)
		}
	}
	for _, f := range sorted(c.findings) {
		t.Error(f)
	}
	t.Logf("checked %d references in %d Markdown files and %d Go files (%d packages)", c.checked, len(files), len(m.files), len(m.pkgs))
	if c.checked < 500 {
		t.Errorf("only %d references checked: is the scan broken?", c.checked)
	}
}

// TestModule checks that the module was read: without its packages,
// TestDocs would find nothing wrong with anything.
func TestModule(t *testing.T) {
	m := theModule(t)
	for _, ref := range []struct{ path, recv, name string }{
		{modulePath + "/ratelimit", "", "Limiter"},
		{modulePath + "/ratelimit", "Limiter", "Bucket"},    // a method
		{modulePath + "/ratelimit", "Decision", "Degraded"}, // a field
		{modulePath + "/ratelimit", "Backend", "Do"},        // an interface method
		{modulePath + "/backend/memory", "", "New"},
		{modulePath + "/failpolicy", "", "WithTimeout"},
		{modulePath + "/benchmarks", "", ""}, // the benchmarks module
	} {
		p, ok := m.pkgs[ref.path]
		if !ok {
			t.Errorf("package %s not found", ref.path)
			continue
		}
		if ref.name != "" && !p.has(ref.recv, ref.name) {
			t.Errorf("%s: %s.%s not found", ref.path, ref.recv, ref.name)
		}
	}
	if q := m.qualifiers(); q["redisbackend"] == nil || q["redis"] != nil {
		t.Errorf("qualifiers: redisbackend %v, redis %v; want sluice's backend/redis as redisbackend only", q["redisbackend"], q["redis"])
	}
}

// TestCatches runs the checker over text naming things that do not
// exist, so that TestDocs cannot pass for finding nothing at all.
func TestCatches(t *testing.T) {
	c := newChecker(theModule(t))
	c.checkMarkdown("bad.md", strings.Join([]string{
		"Set `failpolicy.NoSuchThing` to make it so.",               // 1
		"A supplier backed by a cache (see sluice/quotas) helps.",   // 2
		"Import `github.com/sluicehq/sluice/quotas`.",               // 3
		"See `ratelimit.Config.NoSuchMethod` and `Decision.Bogus`.", // 4
		"The tool is in `cmd/sluice-nosuch/`.",                      // 5
		"Run `go test ./internal/nosuch/`; see [it](nosuch.md).",    // 6
		"See [concepts](docs/concepts.md#no-such-heading).",         // 7
		"```go",                   // 8
		"b := memory.NoSuchNew()", // 9
		"```",                     // 10
		"Run `ExampleNoSuchExample` or `TestNoSuchTest`.",     // 11
		"Pass `WithNoSuchOption(3)`; check `ErrNoSuchError`.", // 12
	}, "\n"))
	checkGoSource(t, c, "bad.go", `// Package bad links to [NoSuch], [ratelimit.NoSuch],
// [ratelimit.Limiter.NoSuch] and [github.com/sluicehq/sluice/quotas.Store],
// and names github.com/sluicehq/sluice/nosuch and docs/nosuch.md.
// A supplier backed by a cache (see sluice/quotas) helps.
package bad

import "github.com/sluicehq/sluice/ratelimit"

var _ ratelimit.Limiter
`)
	want := []string{
		"bad.md:1: failpolicy.NoSuchThing",
		"bad.md:2: sluice/quotas",
		"bad.md:3: github.com/sluicehq/sluice/quotas",
		"bad.md:4: ratelimit.Config.NoSuchMethod",
		"bad.md:4: Decision.Bogus",
		"bad.md:5: cmd/sluice-nosuch/",
		"bad.md:6: ./internal/nosuch/",
		"bad.md:6: nosuch.md",
		"bad.md:7: docs/concepts.md#no-such-heading",
		"bad.md:9: memory.NoSuchNew",
		"bad.md:11: ExampleNoSuchExample",
		"bad.md:11: TestNoSuchTest",
		"bad.md:12: WithNoSuchOption",
		"bad.md:12: ErrNoSuchError",
		"bad.go:1: [NoSuch]",
		"bad.go:1: [ratelimit.NoSuch]",
		"bad.go:2: [ratelimit.Limiter.NoSuch]",
		"bad.go:2: [github.com/sluicehq/sluice/quotas.Store]",
		"bad.go:3: github.com/sluicehq/sluice/nosuch",
		"bad.go:3: docs/nosuch.md",
		"bad.go:4: sluice/quotas",
	}
	compare(t, c.findings, want)
}

// TestPasses runs the checker over text that names only things that
// exist, other libraries' names, and planned things: it must find nothing.
func TestPasses(t *testing.T) {
	c := newChecker(theModule(t))
	c.checkMarkdown("good.md", strings.Join([]string{
		"Pass `failpolicy.WithTimeout` to `failpolicy.Wrap`; see `ratelimit.Config.Validate`.",
		"`redis.Options`, `redis.NewClient`, `rueidis.ClientOption`, `context.Context`, `time.Duration`.",
		"`Decision.Degraded`, `Limiter.Bucket`, `Options.MaxRetries`, `memory.txt`, `redis.md`.",
		"`ExampleLimiter_Bucket`, `WithMaxKeys(n)`, `ErrTooManyKeys`, `DefaultTimeout`, `MaxRetries`, `ErrClosing`.",
		"rueidis returns `rueidis.ErrClosing`.",
		"`github.com/sluicehq/sluice/backend/redis`, `go get github.com/sluicehq/sluice`, `go test ./...`.",
		"`backend/memory`, `internal/test/servers`, `bench/benchstat.txt`, `net/http`, `x/time/rate`, `/proc/cpuinfo`.",
		"`cmd/sluice-nosuch/` (planned) and sluice/quotas, not built yet.",
		"See [concepts](docs/concepts.md#decisions) and [the site](https://example.com/x.md#y).",
		"```go",
		`import "github.com/ulule/limiter/v3/drivers/store/memory"`,
		"store := memory.NewStore()",
		"```",
	}, "\n"))
	checkGoSource(t, c, "good.go", `// Package good links to [ratelimit.Limiter], [ratelimit.Limiter.Bucket],
// [ratelimit.Decision.Degraded], [redis.Options], [context.Context],
// [errors.Is], [Thing] and [Thing.Name], and names
// github.com/sluicehq/sluice/ratelimit and docs/concepts.md.
package good

import (
	"context"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/ratelimit"
)

var (
	_ ratelimit.Limiter
	_ context.Context
	_ redis.Options
)
`)
	compare(t, c.findings, nil)
}

// checkGoSource checks the doc comments of a Go file that declares
// exported Thing with field Name; its imports resolve against the module.
func checkGoSource(t *testing.T, c *checker, name, src string) {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	p := &pkg{path: modulePath + "/internal/" + f.Name.Name, name: f.Name.Name,
		syms:     map[string]bool{"Thing": true, "Thing.Name": true},
		types:    map[string]bool{"Thing": true},
		testSyms: map[string]bool{}, open: map[string]bool{}, imports: map[string]string{}}
	for _, imp := range f.Imports {
		addImport(p.imports, imp)
	}
	c.checkGoFile(goFile{rel: name, pkg: p, ast: f, fset: fset})
}

// compare checks that findings are exactly want, each given as
// "file:line: ref".
func compare(t *testing.T, findings []finding, want []string) {
	t.Helper()
	var got []string
	for _, f := range findings {
		got = append(got, f.file+":"+strconv.Itoa(f.line)+": "+f.ref)
	}
	slices.Sort(got)
	want = slices.Clone(want)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("findings:\n%s\nwant:\n%s\nall:\n%v", strings.Join(got, "\n"), strings.Join(want, "\n"), findings)
	}
}

func sorted(fs []finding) []finding {
	fs = slices.Clone(fs)
	slices.SortFunc(fs, func(a, b finding) int {
		if a.file != b.file {
			return strings.Compare(a.file, b.file)
		}
		return a.line - b.line
	})
	return slices.Compact(fs)
}

// TestMembers checks the members a type gets beyond its own: through
// embedding, and as an alias of another package's type.
func TestMembers(t *testing.T) {
	root := t.TempDir()
	for name, src := range map[string]string{
		"go.mod": "module " + modulePath + "\n",
		"a/a.go": "package a\n\ntype T struct{ Field int }\n\nfunc (T) Method() {}\n",
		"b/b.go": `package b

import (
	"io"

	"` + modulePath + `/a"
)

type Alias = a.T

type inner struct{ Promoted int }

func (*inner) Lifted() {}

type Outer struct {
	*inner
	io.Reader
}

type Wrapped = io.Writer
`,
	} {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m, err := loadModule(root)
	if err != nil {
		t.Fatal(err)
	}
	b := m.pkgs[modulePath+"/b"]
	if b == nil {
		t.Fatalf("package b not loaded: %v", m.pkgs)
	}
	for _, ref := range []struct {
		recv, name string
		want       bool
	}{
		{"Alias", "Field", true},
		{"Alias", "Method", true},
		{"Alias", "Nothing", false},
		{"Outer", "Promoted", true},
		{"Outer", "Lifted", true},
		{"Outer", "Reader", true},
		{"Outer", "Read", true}, // io.Reader's: open
		{"Wrapped", "Write", true},
		{"", "inner", false},
	} {
		if got := b.has(ref.recv, ref.name); got != ref.want {
			t.Errorf("has(%q, %q) = %v, want %v", ref.recv, ref.name, got, ref.want)
		}
	}
}
