// Package doccheck holds a test that keeps sluice's documentation true to
// its code: every package, identifier and repository path a doc names must
// exist. It has no code of its own; go test ./... (and so make test) runs
// it, and each finding names the file, the line and the missing reference.
//
// # What it reads
//
// The packages of the module and of the benchmarks module, parsed with
// go/parser (no build, no network): each package's exported names, with
// the methods and fields of its types as Type.Member, promoted members and
// those of aliased types included.
//
// It checks every Markdown file in the repository except the raw outputs
// under docs/results/ and benchmarks/results/, and every doc comment of
// every .go file (package, declaration and field comments, tests included)
// but this package's own, which name missing things on purpose.
//
// # What it checks
//
//   - Qualified names whose qualifier is a sluice package name:
//     ratelimit.Limiter, failpolicy.WithTimeout, ratelimit.Config.Validate.
//     Only package names that no other library the docs use shares count,
//     so redis.Options (go-redis) and rueidis.ClientOption go unchecked:
//     sluice's Redis backends are checked as redisbackend and
//     rueidisbackend, their package names. A name that a Go file or a
//     Markdown code block imports from elsewhere is not checked there.
//   - Import paths of the module, with an optional .Name or /..., and the
//     short spelling sluice/x: x must be a package's path in the module,
//     or the last element of one (sluice/redis and sluice/go-redis, as
//     labels and error messages name the Redis backends).
//   - Go doc links, resolved as go doc resolves them: [Name] and
//     [Type.Method] against the package itself (and, in a test file, what
//     its tests declare), [pkg.Name] against the package's imports and its
//     own name, and [github.com/sluicehq/sluice/x.Name] by path. Where go doc
//     would find no package, a sluice package of that name is used. Links
//     to other libraries and the standard library are not checked. A
//     capitalised [Name] that the package lacks is a finding, though go doc
//     would print it as plain text.
//   - In Markdown code spans: a whole span Type.Member where Type is a
//     sluice type (`Decision.Degraded`), unless the same file qualifies a
//     type of that name with another library's package (`redis.Options`);
//     a span naming a Test, Benchmark, Fuzz or Example function; and a span
//     naming an Err, With or Default identifier, which must be a name or
//     method of some sluice package.
//   - Repository paths: relative Markdown links, and their #fragments
//     against the target's headings as GitHub makes anchors; and, in code
//     spans, code blocks and Go comments, slash paths whose first element
//     is a directory at the repository root, or cmd, or that end in a slash
//     (`cmd/sluice-demo/`, `internal/test/servers`, ./backend/memory). They are
//     looked for from the root and from the Markdown file's directory or
//     the Go file's module. Other slash paths (bench/benchstat.txt, which
//     make bench writes; net/http) are not checked.
//
// # Planned things
//
// A line that says "planned", "not built yet", "not yet built" or "not yet
// here" (in any case) may name packages, identifiers and paths that do not
// exist: that is how DESIGN-style text describes what is still to come
// ("cmd/sluice-nosuch/ (planned)"). The exemption covers that source line
// only, and not Go doc links, which should never point at nothing.
package doccheck
