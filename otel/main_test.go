package otel_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any leaves a goroutine behind: a
// span processor or a meter provider not shut down, a backend not closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
