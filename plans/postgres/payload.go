package postgres

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/plans"
)

// Payload kinds, as the triggers write them.
const (
	planKind    = "plan"
	subjectKind = "subject"
)

// parsePayload reads a notification's payload, <kind>:<id>:<version>: the
// kind before the first colon, the version after the last, so that the id
// may hold colons.
func parsePayload(payload string) (plans.Change, error) {
	kind, rest, ok := strings.Cut(payload, ":")
	i := strings.LastIndexByte(rest, ':')
	if !ok || i < 0 {
		return plans.Change{}, fmt.Errorf("postgres: notification %q: want <kind>:<id>:<version>", payload)
	}
	var c plans.Change
	switch kind {
	case planKind:
		c.Kind = plans.PlanChanged
	case subjectKind:
		c.Kind = plans.AssignmentChanged
	default:
		return plans.Change{}, fmt.Errorf("postgres: notification %q: kind %q is neither %q nor %q", payload, kind, planKind, subjectKind)
	}
	c.ID = rest[:i]
	if c.ID == "" {
		return plans.Change{}, fmt.Errorf("postgres: notification %q: empty id", payload)
	}
	v, err := strconv.ParseUint(rest[i+1:], 10, 64)
	if err != nil || v < 1 || v > plans.MaxVersion {
		return plans.Change{}, fmt.Errorf("postgres: notification %q: version %q is not an integer from 1 to 2^53-1", payload, rest[i+1:])
	}
	c.Version = v
	return c, nil
}
