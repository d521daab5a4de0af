package sharding

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/ratelimit"
)

// SubBucket is where one sub-bucket of a hot key lives, as
// [Backend.Slots] reports it.
type SubBucket struct {
	// Key is the sub-bucket's key in the wrapped Backend.
	Key string
	// Slot is its Redis Cluster hash slot, or -1 when the wrapped Backend
	// has no slots.
	Slot int
	// Master is the address of the master serving Slot, or "" when the
	// wrapped Backend cannot report its cluster's masters.
	Master string
}

// Slots reports where each of the sub-buckets of the hot key key lives:
// its key, its slot and the master that serves it now, asking the
// wrapped Backend's [ratelimit.TopologyReporter] for the masters. It
// lists all the sub-buckets of key's rule; a config with fewer tokens
// than that uses only the first ones. A key no rule matches, or one that
// [Backend.Do] rejects as a sub-bucket's, is an error wrapping
// [ratelimit.ErrInvalidKey]; the masters' errors are returned as they are,
// but for [errors.ErrUnsupported], which leaves Master empty.
func (b *Backend) Slots(ctx context.Context, key string) ([]SubBucket, error) {
	if b.isSubKey(key) {
		return nil, subKeyError(key)
	}
	r, names := b.hot(key)
	if r == nil {
		return nil, fmt.Errorf("%w: sharding: key %q is not split by any rule", ratelimit.ErrInvalidKey, key)
	}
	if names == nil {
		return nil, checkKey(key)
	}
	var masters []ratelimit.Master
	if t, ok := b.next.(ratelimit.TopologyReporter); ok && b.namer.slots != nil {
		var err error
		if masters, err = t.Masters(ctx); err != nil && !errors.Is(err, errors.ErrUnsupported) {
			return nil, err
		}
	}
	subs := make([]SubBucket, len(names))
	for i, name := range names {
		subs[i] = SubBucket{Key: name, Slot: -1}
		if b.namer.slots == nil {
			continue
		}
		subs[i].Slot, _ = b.namer.slots.Slot(name)
		if m := ratelimit.Owner(masters, subs[i].Slot); m >= 0 {
			subs[i].Master = masters[m].Addr
		}
	}
	return subs, nil
}

var (
	_ ratelimit.SlotMapper       = (*Backend)(nil)
	_ ratelimit.NodeLocator      = (*Backend)(nil)
	_ ratelimit.TopologyReporter = (*Backend)(nil)
)

// Slot returns the slot of the bucket at key from the wrapped Backend, for
// a key no rule splits; a hot key has no one slot, and gets false.
func (b *Backend) Slot(key string) (int, bool) {
	if b.namer.slots == nil || b.ruleOf(key) != nil {
		return 0, false
	}
	return b.namer.slots.Slot(key)
}

// Node names the node serving the bucket at key, from the wrapped
// Backend, for a key no rule splits; for a hot key, whose sub-buckets live
// on several, and when the wrapped Backend cannot tell, it returns "".
func (b *Backend) Node(key string) string {
	l, ok := b.next.(ratelimit.NodeLocator)
	if !ok {
		return ""
	}
	if b.ruleOf(key) != nil {
		return ""
	}
	return l.Node(key)
}

// Masters reports the wrapped Backend's masters; see
// [ratelimit.TopologyReporter]. Without one it returns an error wrapping
// [errors.ErrUnsupported].
func (b *Backend) Masters(ctx context.Context) ([]ratelimit.Master, error) {
	if t, ok := b.next.(ratelimit.TopologyReporter); ok {
		return t.Masters(ctx)
	}
	return nil, fmt.Errorf("sharding: Masters: the wrapped Backend cannot report them: %w", errors.ErrUnsupported)
}
