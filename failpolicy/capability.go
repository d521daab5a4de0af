package failpolicy

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/ratelimit"
)

// A Backend has the optional capabilities of the one it wraps, so that a
// decorator over it (sharding, which names its sub-buckets by slot) or
// under it finds them; where the next Backend lacks one, it says it
// cannot tell.
var (
	_ ratelimit.SlotMapper       = (*Backend)(nil)
	_ ratelimit.NodeLocator      = (*Backend)(nil)
	_ ratelimit.TopologyReporter = (*Backend)(nil)
)

// Slot returns the next Backend's Slot for key if it is a
// [ratelimit.SlotMapper], and (0, false) if not.
func (b *Backend) Slot(key string) (slot int, ok bool) {
	if b.slots == nil {
		return 0, false
	}
	return b.slots.Slot(key)
}

// Node returns the next Backend's Node for key if it is a
// [ratelimit.NodeLocator], and "" if not. It is what picks the key's
// breaker.
func (b *Backend) Node(key string) string {
	if b.breakers.locator == nil {
		return ""
	}
	return b.breakers.locator.Node(key)
}

// Masters returns the next Backend's Masters if it is a
// [ratelimit.TopologyReporter], and otherwise an error wrapping
// [errors.ErrUnsupported]. It goes to the store with ctx as it is, under
// neither the deadline nor the breaker.
func (b *Backend) Masters(ctx context.Context) ([]ratelimit.Master, error) {
	if b.topology == nil {
		return nil, fmt.Errorf("failpolicy: Masters: the next Backend, a %T, cannot report its masters: %w", b.next, errors.ErrUnsupported)
	}
	return b.topology.Masters(ctx)
}
