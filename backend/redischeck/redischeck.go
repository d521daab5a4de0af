// Package redischeck holds what the Check method of sluice's Redis
// backends finds: [github.com/sluicehq/sluice/backend/redis] (go-redis)
// and [github.com/sluicehq/sluice/backend/rueidis] both return a [Report],
// with an error wrapping [ErrUnsafeServer] when a setting of a server or of
// the client can break the limits. Each backend's Report and Server are
// these types, so code that logs or acts on a report works with either
// backend; this package imports neither client.
//
// Check is for start-up: log the problems, or refuse to start. Decisions
// never call it.
package redischeck

import "errors"

// ErrUnsafeServer is wrapped by the error a backend's Check returns when a
// setting can break the limits. The error's message lists every problem
// of [Report.Problems], each with what happens and how to fix it.
var ErrUnsafeServer = errors.New("sluice: unsafe Redis setting")

// Report is what a backend's Check found.
type Report struct {
	// Servers lists every server the client reaches (in a cluster, every
	// master and replica), sorted by address.
	Servers []Server
	// Problems lists, in words, each setting of a server or of the client
	// that can break the limits, with how to fix it; Check's error holds
	// the same. Empty when all is well.
	Problems []string
}

// Server is one server as a backend's Check saw it.
type Server struct {
	// Addr is the server's address as the client knows it; for a go-redis
	// failover client, which knows none, the master's own, from CLIENT
	// INFO.
	Addr string
	// Version is redis_version from INFO.
	Version string
	// MaxmemoryPolicy is maxmemory_policy from INFO: only noeviction keeps
	// buckets safe, because every bucket key has a TTL and the volatile-*
	// policies evict such keys as readily as the allkeys-* ones do.
	MaxmemoryPolicy string
}
