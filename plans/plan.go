package plans

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/sluicehq/sluice/ratelimit"
)

// ErrInvalidPlan is returned for a plan that [Plan.Validate] rejects, and
// for a stored plan row that does not parse ([PlanFromRow],
// [ParseBandwidths]). The wrapped message names the plan, its version and
// the field; when the bandwidths are what is wrong, the error also wraps
// [ratelimit.ErrInvalidConfig].
var ErrInvalidPlan = errors.New("plans: invalid plan")

const (
	// MaxNameLen is the longest plan name, in bytes.
	MaxNameLen = 64
	// MaxVersion is the highest plan or assignment version: 2^53-1, the
	// largest integer the Redis backends' Lua scripts (whose numbers are
	// doubles) hold exactly.
	MaxVersion = 1<<53 - 1
)

// Validate reports whether p is a plan a [Store] may return: a Name of 1
// to [MaxNameLen] bytes of printable UTF-8, a Version from 1 to
// [MaxVersion], and a config that [ratelimit.Config.Validate] accepts. The
// error wraps [ErrInvalidPlan] and names the plan, its version and the
// first bad field. It never panics.
func (p Plan) Validate() error { return p.validate(1) }

// validate is Validate with the lowest accepted Version: 0 is allowed for
// a cache's default plan, which comes from code, not from a store.
func (p Plan) validate(minVersion uint64) error {
	switch {
	case p.Name == "":
		return p.invalid("Name must not be empty")
	case len(p.Name) > MaxNameLen:
		return p.invalid(fmt.Sprintf("Name must be at most %d bytes, got %d", MaxNameLen, len(p.Name)))
	case !printable(p.Name):
		return p.invalid(fmt.Sprintf("Name %q must be printable UTF-8", p.Name))
	case p.Version < minVersion || p.Version > MaxVersion:
		return p.invalid(fmt.Sprintf("Version must be between %d and 2^53-1, got %d", minVersion, p.Version))
	}
	if err := p.Config().Validate(); err != nil {
		return &planError{plan: p.Name, version: p.Version, hasPlan: true, reason: configReason(err), cause: err}
	}
	return nil
}

// Config returns the plan's limits as a [ratelimit.Config] at the plan's
// version, so that a bucket changes forward only (see
// [ratelimit.Config.Version]). It allocates nothing: the config shares
// p.Bandwidths, which callers must not modify.
func (p Plan) Config() ratelimit.Config {
	return ratelimit.Config{Algorithm: p.Algorithm, Bandwidths: p.Bandwidths, Version: p.Version}
}

// ParseAlgorithm returns the algorithm named s, as [ratelimit.Algorithm]'s
// String spells it ("TokenBucket", "GCRA", ...): it is
// [ratelimit.Algorithm.UnmarshalText]. There is no default: "" is an
// error, wrapping [ratelimit.ErrInvalidConfig].
func ParseAlgorithm(s string) (ratelimit.Algorithm, error) {
	var a ratelimit.Algorithm
	err := a.UnmarshalText([]byte(s))
	return a, err
}

// PlanFromRow builds the plan a store read: name and version as stored,
// algorithm as [ParseAlgorithm] reads it, and bandwidths in the JSON form
// [ParseBandwidths] reads. It returns the plan only if it is valid; the
// error wraps [ErrInvalidPlan] and names the plan, its version and the
// field, as in
//
//	plans: invalid plan: plan "pro" version 7: bandwidths[1].refill_period: missing
func PlanFromRow(name string, version uint64, algorithm string, bandwidths []byte) (Plan, error) {
	p := Plan{Name: name, Version: version}
	alg, err := ParseAlgorithm(algorithm)
	if err != nil {
		return Plan{}, &planError{plan: name, version: version, hasPlan: true, reason: configReason(err), cause: err}
	}
	p.Algorithm = alg
	bws, err := ParseBandwidths(bandwidths)
	if err != nil {
		var pe *planError
		if errors.As(err, &pe) {
			named := *pe
			named.plan, named.version, named.hasPlan = name, version, true
			return Plan{}, &named
		}
		return Plan{}, err
	}
	p.Bandwidths = bws
	if err := p.Validate(); err != nil {
		return Plan{}, err
	}
	return p, nil
}

// planError is an invalid plan: what is wrong with it (a field and a
// message), and which plan when that is known.
type planError struct {
	plan    string
	version uint64
	hasPlan bool
	reason  string
	cause   error // what made reason, if another error did; may be nil
}

func (e *planError) Error() string {
	if !e.hasPlan {
		return ErrInvalidPlan.Error() + ": " + e.reason
	}
	return fmt.Sprintf("%v: plan %q version %d: %s", ErrInvalidPlan, e.plan, e.version, e.reason)
}

func (e *planError) Unwrap() []error {
	if e.cause == nil {
		return []error{ErrInvalidPlan}
	}
	return []error{ErrInvalidPlan, e.cause}
}

func (p Plan) invalid(reason string) error {
	return &planError{plan: p.Name, version: p.Version, hasPlan: true, reason: reason}
}

// configReason is a ratelimit validation error's message without its
// "ratelimit: invalid config: " prefix, which a plan error replaces.
func configReason(err error) string {
	return strings.TrimPrefix(err.Error(), ratelimit.ErrInvalidConfig.Error()+": ")
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}
