package doccheck

import (
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// testSupport is the directory of the repository's test support: the
// servers tests start, the distributed harness, the Redis backends' shared
// tests, the distributed tests and this check.
const testSupport = "internal/test"

// importers of the test support that are not tests, with what lies under
// them: the sluice-verify command runs the harness's check against a
// user's Redis, and the test kit module is test support itself.
var testSupportImporters = []string{"cmd/sluice-verify", "testkit"}

// TestTestSupportStaysApart checks the layout README.md describes: no
// non-test file outside internal/test imports a package under it, but
// sluice-verify's and the test kit's, so that production code and what
// tests need stay apart.
func TestTestSupportStaysApart(t *testing.T) {
	m := theModule(t)
	prefix := modulePath + "/" + testSupport + "/"
	checked := 0
	for _, gf := range m.files {
		dir := path.Dir(gf.rel)
		if gf.test || dir == testSupport || strings.HasPrefix(dir, testSupport+"/") || slices.ContainsFunc(testSupportImporters, func(d string) bool { return dir == d || strings.HasPrefix(dir, d+"/") }) {
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

// TestSDKRequiresNoTestKit: the SDK's go.mod requires neither the test kit
// module nor its container dependencies, which would otherwise reach every
// service that imports sluice (go mod tidy loads the tests of the packages
// a service imports). The test kit requires the SDK, not the other way.
func TestSDKRequiresNoTestKit(t *testing.T) {
	m := theModule(t)
	b, err := os.ReadFile(filepath.Join(m.root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, banned := range []string{modulePath + "/testkit", "github.com/testcontainers/", "github.com/docker/", "github.com/moby/"} {
		if strings.Contains(string(b), banned) {
			t.Errorf("go.mod names %s: the SDK must not depend on the test kit or its containers", banned)
		}
	}
}
