package sharding

import (
	"slices"

	"github.com/sluicehq/sluice/ratelimit"
)

// Layer returns a [ratelimit.Layer] for [ratelimit.Stack] that wraps the
// layer below it with [New] and opts. Its place is
// [ratelimit.PlaceSharding], above the fail policy, so that a sub-bucket
// the policy gave up on moves the request on to the next one (see the
// package doc's With failpolicy). Bad options are New's errors, which
// Stack returns.
func Layer(opts ...Option) ratelimit.Layer {
	return layer{opts: slices.Clone(opts)}
}

// layer is the [ratelimit.Layer] Layer returns.
type layer struct{ opts []Option }

func (layer) Place() ratelimit.Place { return ratelimit.PlaceSharding }

func (l layer) Wrap(next ratelimit.Backend) (ratelimit.Backend, error) {
	b, err := New(next, l.opts...)
	if err != nil {
		// Not b: a nil *Backend in the interface would not be nil.
		return nil, err
	}
	return b, nil
}
