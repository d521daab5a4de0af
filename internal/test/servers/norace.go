//go:build !race

package servers

// raceEnabled says that this binary has the race detector, so that
// [BuildInstance] gives it to the instance program too.
const raceEnabled = false
