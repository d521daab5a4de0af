package redisscript

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/ratelimit"
)

// Backend is what the Redis backends share once each has its client's
// Runner: the bodies of their Do, DoPermit, Slot, Node and Masters, which
// each backend's methods of those names hand their calls to.
type Backend struct {
	Name     string // names the backend in its errors
	Settings Settings
	Runner   *Runner
	Topology *Topology // nil unless the client is a cluster's
}

// Do applies req to the bucket at key in one call of its function (or
// script); see [ratelimit.Backend].
func (b *Backend) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	call, err := b.Settings.Prepare(ctx, b.Name, key, cfg, req)
	if err != nil {
		return ratelimit.Decision{}, err
	}
	reply, err := b.Runner.Run(ctx, call)
	if err != nil {
		return ratelimit.Decision{}, Error(ctx, err, What(b.Name, req.Op, key))
	}
	return call.Decision(reply)
}

// DoPermit applies req to the concurrency permits of key in one call of
// the permits' function (or script); see [ratelimit.PermitBackend].
func (b *Backend) DoPermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	call, err := b.Settings.PreparePermit(ctx, b.Name, key, lim, req)
	if err != nil {
		return ratelimit.PermitDecision{}, err
	}
	reply, err := b.Runner.Run(ctx, call.Call)
	if err != nil {
		return ratelimit.PermitDecision{}, Error(ctx, err, What(b.Name, req.Op, key))
	}
	return call.Decision(reply)
}

// Slot returns the hash slot of the bucket at key, and of its permits.
func (b *Backend) Slot(key string) int { return Slot(b.Settings.Prefix, key) }

// Node returns the address of the master that serves the bucket at key:
// "" for a client that is not a cluster's, and until the first slot map
// has loaded.
func (b *Backend) Node(key string) string {
	if b.Topology == nil {
		return ""
	}
	return b.Topology.Node(b.Slot(key))
}

// Masters asks the cluster for its masters and their slots. For a client
// that is not a cluster's it returns an error wrapping
// [errors.ErrUnsupported] that says notCluster.
func (b *Backend) Masters(ctx context.Context, notCluster string) ([]ratelimit.Master, error) {
	if b.Topology == nil {
		return nil, fmt.Errorf("%s: Masters: %s: %w", b.Name, notCluster, errors.ErrUnsupported)
	}
	return b.Topology.Masters(ctx)
}

// ClusterTopology returns the slot map of a cluster, loaded by the backend
// called name with fetch, which sends CLUSTER SHARDS, and parse, which
// decodes the client's reply. A failed call is a store error as [Error]
// makes it; a reply that does not decode, or names no master for some
// slots, wraps [ratelimit.ErrBackendUnavailable].
func ClusterTopology[R any](name string, fetch func(context.Context) (R, error), parse func(R) ([]Shard, error)) *Topology {
	return NewTopology(func(ctx context.Context) ([]ratelimit.Master, error) {
		reply, err := fetch(ctx)
		if err != nil {
			return nil, Error(ctx, err, name+": CLUSTER SHARDS")
		}
		shards, err := parse(reply)
		var masters []ratelimit.Master
		if err == nil {
			masters, err = Masters(shards)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ratelimit.ErrBackendUnavailable, name, err)
		}
		return masters, nil
	})
}
