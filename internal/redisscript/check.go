package redisscript

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrUnsafeServer is the error Check returns when a setting would break
// the limits: wrapped with what was found and how to fix it.
var ErrUnsafeServer = errors.New("sluice: unsafe Redis setting")

// Report is what a backend's Check found.
type Report struct {
	// Servers lists every server the client reaches (in a cluster, every
	// master and replica), by address.
	Servers []Server
	// Problems lists, in words, each setting that can break the limits;
	// Check's error holds the same. Empty when all is well.
	Problems []string
}

// Server is one server as Check saw it.
type Server struct {
	// Addr is the server's address as the client knows it.
	Addr string
	// Version is redis_version from INFO.
	Version string
	// MaxmemoryPolicy is maxmemory_policy from INFO: only noeviction keeps
	// buckets safe, because every bucket key has a TTL and the volatile-*
	// policies evict such keys as readily as the allkeys-* ones do.
	MaxmemoryPolicy string
}

// ParseInfo reads the fields of a Server from the reply to INFO.
func ParseInfo(addr, info string) Server {
	s := Server{Addr: addr}
	for line := range strings.Lines(info) {
		name, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch name {
		case "redis_version":
			s.Version = value
		case "maxmemory_policy":
			s.MaxmemoryPolicy = value
		}
	}
	return s
}

// Assess builds the Report of servers, adding clientProblems (settings of
// the client itself), and returns it with an error wrapping
// [ErrUnsafeServer] that lists every problem, or nil.
func Assess(servers []Server, clientProblems ...string) (Report, error) {
	slices.SortFunc(servers, func(a, b Server) int { return strings.Compare(a.Addr, b.Addr) })
	r := Report{Servers: servers}
	for _, s := range servers {
		switch s.MaxmemoryPolicy {
		case "noeviction":
		case "":
			r.Problems = append(r.Problems, fmt.Sprintf("%s: INFO shows no maxmemory_policy; make sure it is noeviction", s.Addr))
		default:
			r.Problems = append(r.Problems, fmt.Sprintf("%s: maxmemory-policy is %s, which may evict bucket keys and so reset limits under memory pressure; set it to noeviction", s.Addr, s.MaxmemoryPolicy))
		}
	}
	r.Problems = append(r.Problems, clientProblems...)
	if len(r.Problems) == 0 {
		return r, nil
	}
	return r, fmt.Errorf("%w: %s", ErrUnsafeServer, strings.Join(r.Problems, "; "))
}
