package redisscript

import (
	"fmt"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/backend/redischeck"
)

// ParseInfo reads the fields of a [redischeck.Server] from the reply to
// INFO.
func ParseInfo(addr, info string) redischeck.Server {
	s := redischeck.Server{Addr: addr}
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

// Assess builds the [redischeck.Report] of servers, adding clientProblems
// (settings of the client itself), and returns it with an error wrapping
// [redischeck.ErrUnsafeServer] that lists every problem, or nil.
func Assess(servers []redischeck.Server, clientProblems ...string) (redischeck.Report, error) {
	slices.SortFunc(servers, func(a, b redischeck.Server) int { return strings.Compare(a.Addr, b.Addr) })
	r := redischeck.Report{Servers: servers}
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
	return r, fmt.Errorf("%w: %s", redischeck.ErrUnsafeServer, strings.Join(r.Problems, "; "))
}
