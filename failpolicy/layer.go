package failpolicy

import (
	"slices"

	"github.com/sluicehq/sluice/ratelimit"
)

// Layer returns a [ratelimit.Layer] for [ratelimit.Stack] that wraps the
// layer below it with [Wrap], mode and opts. Its place is
// [ratelimit.PlaceFailPolicy], next to the store, so that the deadline
// and the breakers judge each store call, a sharded key's sub-bucket
// calls each on its own. A bad mode or option is Wrap's error, which
// Stack returns. The [*Backend] it makes is closed by
// [ratelimit.Stacked.Close].
func Layer(mode Mode, opts ...Option) ratelimit.Layer {
	return layer{mode: mode, opts: slices.Clone(opts)}
}

// layer is the [ratelimit.Layer] Layer returns.
type layer struct {
	mode Mode
	opts []Option
}

func (layer) Place() ratelimit.Place { return ratelimit.PlaceFailPolicy }

func (l layer) Wrap(next ratelimit.Backend) (ratelimit.Backend, error) {
	b, err := Wrap(next, l.mode, l.opts...)
	if err != nil {
		// Not b: a nil *Backend in the interface would not be nil.
		return nil, err
	}
	return b, nil
}
