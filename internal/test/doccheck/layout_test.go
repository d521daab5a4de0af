package doccheck

import (
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// testSupport is the directory of the repository's test support: the
// servers tests start, the distributed harness, the Redis backends' shared
// tests, the distributed tests and this check.
const testSupport = "internal/test"

// importers of the test support that are not tests: the sluice-verify
// command runs the harness's check against a user's Redis.
var testSupportImporters = []string{"cmd/sluice-verify"}

// TestTestSupportStaysApart checks the layout README.md describes: no
// non-test file outside internal/test imports a package under it, but the
// commands that are checks themselves, so that production code and what
// tests need stay apart.
func TestTestSupportStaysApart(t *testing.T) {
	m := theModule(t)
	prefix := modulePath + "/" + testSupport + "/"
	checked := 0
	for _, gf := range m.files {
		dir := path.Dir(gf.rel)
		if gf.test || dir == testSupport || strings.HasPrefix(dir, testSupport+"/") || slices.Contains(testSupportImporters, dir) {
			continue
		}
		checked++
		for _, imp := range gf.ast.Imports {
			if p, err := strconv.Unquote(imp.Path.Value); err == nil && strings.HasPrefix(p, prefix) {
				t.Errorf("%s imports %s: production code must not import the test support under %s/", gf.rel, p, testSupport)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no production file was checked")
	}
}
