// Package rlsconfig reads sluice-server's limits: envoyproxy/ratelimit's
// YAML (a domain, nested descriptors of key and optional value, each with
// an optional rate_limit of unit and requests_per_unit, unlimited,
// shadow_mode, quota_mode, metadata, wildcard values, replaces,
// detailed_metric, value_to_metric and share_threshold) and sluice's own fields on a
// rate_limit (algorithm, burst, bandwidths, plan, shards) and on a
// domain (fail_mode).
//
// [Load] reads a file, or every *.yaml and *.yml file of a directory, and
// refuses the whole set on the first fault, naming the file, the line and
// the field. A loaded [Config] is never changed: a reload loads a new one.
// [Domain.Lookup] finds a request descriptor's limit as envoyproxy/ratelimit
// does, and names the bucket that counts it.
package rlsconfig

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/ratelimit"
)

// Unit is the unit of a rate_limit, as Envoy's API names it.
type Unit = rlspb.RateLimitResponse_RateLimit_Unit

// Limit is the rate_limit of one descriptor of the config.
type Limit struct {
	// Path is the descriptor's place in the config, as envoyproxy/ratelimit
	// names its statistics: the domain, then each level's key, or key_value
	// when the config gives a value ("another.key2", "test.key1_value1.sub").
	// It is the class of the limit's buckets in the metrics.
	Path string
	// File and Line are where the rate_limit is written.
	File string
	Line int

	// Name is the rate_limit's name, which other limits' replaces name.
	Name string
	// Replaces are the names of the limits a request that matches this one
	// does not check.
	Replaces []string
	// Unlimited limits are matched (and can replace others) but never
	// counted: a descriptor that matches one is always OK.
	Unlimited bool
	// ShadowMode limits are counted, but a request over one is told OK.
	ShadowMode bool
	// QuotaMode limits refuse a request only together: a request is over
	// its quota when every quota limit it matched is over (and over its
	// limits when any other is).
	QuotaMode bool
	// Metadata is the descriptor's metadata, which a response's dynamic
	// metadata carries when the descriptor passes; nil for none.
	Metadata *structpb.Struct
	// DetailedMetric puts the request's own values into the metrics'
	// class of the limit's buckets, as envoyproxy/ratelimit puts them into
	// its statistic's name.
	DetailedMetric bool
	// Plan limits take their config from the plan store: the subject is the
	// value of the descriptor's last entry.
	Plan bool
	// Shards splits each of the limit's buckets into this many sub-buckets
	// on distinct Redis Cluster slots (package sharding); 0 for none.
	Shards int

	// Unit and RequestsPerUnit are what the response reports as the
	// descriptor's current_limit. For a limit written with unit and
	// requests_per_unit they are those; for one written with bandwidths,
	// the first bandwidth's, as [Reported] gives them.
	Unit            Unit
	RequestsPerUnit uint32
	// Config is the config of the limit's buckets: the zero Config for
	// Unlimited and Plan limits, and for a limit of 0 requests per unit
	// (see Blocked).
	Config ratelimit.Config

	// domain, levels and keys are Path's parts: the domain, each level's
	// key or key_value, and each level's key alone; valueToMetric marks
	// the levels whose class takes the request's value (value_to_metric).
	domain        string
	levels, keys  []string
	valueToMetric []bool
}

// Blocked reports whether the limit admits nothing: requests_per_unit is 0.
// Nothing is counted for it.
func (l *Limit) Blocked() bool {
	return !l.Unlimited && !l.Plan && l.RequestsPerUnit == 0
}

// Config is a loaded set of domains. It is never changed once loaded.
type Config struct {
	domains map[string]*Domain
	limits  map[string]*Limit // by Path
	// Files are the files it was loaded from, in the order read.
	Files []string
}

// Domain returns the domain named name, or nil.
func (c *Config) Domain(name string) *Domain {
	return c.domains[name]
}

// Domains returns the names of the config's domains, sorted.
func (c *Config) Domains() []string {
	names := make([]string, 0, len(c.domains))
	for n := range c.domains {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// FailModes are the values of a domain's fail_mode: what sluice-server
// answers for the domain's descriptors when the store cannot decide
// (package failpolicy's modes), and "error", which answers the request
// with a gRPC error so that Envoy's failure_mode_deny decides.
var FailModes = []string{"open", "closed", "local", "error"}

// Domain is one domain of the config: its descriptors, as a tree.
type Domain struct {
	// Name is the domain, as requests name it.
	Name string
	// FailMode is one of FailModes, or "" for the server's default.
	FailMode string
	root     node
	plans    bool // some limit has plan: true
}

// HasPlans reports whether a limit of the domain takes its config from the
// plan store.
func (d *Domain) HasPlans() bool { return d.plans }

// node is one level of a domain's descriptors: its children by key, or
// key_value when the config gives a value, and those of them whose value
// holds a wildcard, in the config's order.
type node struct {
	children  map[string]*node
	wildcards []wildcard
	limit     *Limit
	// share marks a wildcard node whose requests share one bucket, named
	// by the pattern, instead of a bucket per value.
	share bool
	// pattern is the node's value as the config writes it.
	pattern string
}

// wildcard is a child whose key_value holds a '*', split at each '*'.
type wildcard struct {
	name  string
	parts []string
}

// matches reports whether s (a request's key_value) matches the pattern:
// each '*' stands for any run of bytes, the empty one too.
func (w *wildcard) matches(s string) bool {
	p := w.parts
	if len(p) == 1 {
		return s == p[0]
	}
	if !strings.HasPrefix(s, p[0]) {
		return false
	}
	s = s[len(p[0]):]
	last := p[len(p)-1]
	for _, part := range p[1 : len(p)-1] {
		i := strings.Index(s, part)
		if i < 0 {
			return false
		}
		s = s[i+len(part):]
	}
	return strings.HasSuffix(s, last)
}

// Match is what a request descriptor matched.
type Match struct {
	// Limit is the descriptor's limit.
	Limit *Limit
	// Key is the bucket that counts the descriptor: the limit's Path and
	// the request's values (a shared wildcard's pattern in place of its
	// value), so that each distinct set of values has a bucket of its own
	// under each limit. A key longer than ratelimit.MaxKeyLen holds a
	// SHA-256 of the values instead of the values.
	Key string
	// Subject is the value of the descriptor's last entry: a Plan limit's
	// plan subject.
	Subject string
}

// Lookup finds the limit of descriptor d, as envoyproxy/ratelimit does:
// level by level, an entry matches the child of its key_value, else the
// first wildcard child its key_value matches, else the child of its key
// alone; the limit is the one of the child the last entry matched. A
// descriptor that stops matching before its last entry, or whose last
// match has no limit, or that has more entries than the config has levels,
// has none.
func (dom *Domain) Lookup(d *commonpb.RateLimitDescriptor) (Match, bool) {
	entries := d.GetEntries()
	if len(entries) == 0 {
		return Match{}, false
	}
	n := &dom.root
	values := make([]string, len(entries))
	for i, e := range entries {
		kv := e.GetKey() + "_" + e.GetValue()
		next, ok := n.children[kv]
		values[i] = e.GetValue()
		if !ok {
			for j := range n.wildcards {
				if w := &n.wildcards[j]; w.matches(kv) {
					next = n.children[w.name]
					break
				}
			}
		}
		if next == nil {
			next = n.children[e.GetKey()]
		}
		if next == nil {
			return Match{}, false
		}
		if next.share {
			values[i] = next.pattern
		}
		if i == len(entries)-1 {
			if next.limit == nil {
				return Match{}, false
			}
			return Match{Limit: next.limit, Key: bucketKey(next.limit, values), Subject: e.GetValue()}, true
		}
		n = next
	}
	return Match{}, false
}

// keySep separates a bucket key's path from its values, and its values
// from each other; escapeByte starts an escaped byte, %XX.
const (
	keySep     = '|'
	escapeByte = '%'
)

// Bytes escaped in a bucket key: keySep and escapeByte everywhere; '.',
// which separates a path's parts, in a part; '#', which starts the hash of
// values too long to write out, in a value (so that no value can pass for
// another's hash).
const (
	pathSpecial  = ".|%"
	valueSpecial = "#|%"
)

// bucketKey is the key of the bucket of limit l for the request's values.
func bucketKey(l *Limit, values []string) string {
	var b strings.Builder
	b.WriteString(l.Path)
	for _, v := range values {
		b.WriteByte(keySep)
		escapeTo(&b, v, valueSpecial)
	}
	if b.Len() <= ratelimit.MaxKeyLen {
		return b.String()
	}
	sum := sha256.Sum256([]byte(b.String()[len(l.Path):]))
	return l.Path + string(keySep) + "#" + hex.EncodeToString(sum[:])
}

// escapeTo writes s to b with each byte of special written as %XX.
func escapeTo(b *strings.Builder, s, special string) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; strings.IndexByte(special, c) >= 0 {
			fmt.Fprintf(b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
}

// ClassOf is the metrics class of the bucket key: the limit's Path, or
// with detailed_metric the whole key, or with value_to_metric on some
// levels the path with the request's values at those levels. It is "" for
// a key that Lookup did not make.
func (c *Config) ClassOf(key string) string {
	path, values, ok := strings.Cut(key, string(keySep))
	if !ok {
		return ""
	}
	l := c.limits[path]
	switch {
	case l == nil:
		return ""
	case l.DetailedMetric:
		return key
	case !slices.Contains(l.valueToMetric, true) || strings.HasPrefix(values, "#"):
		return path
	}
	vals := strings.Split(values, string(keySep))
	if len(vals) != len(l.levels) {
		return path
	}
	var b strings.Builder
	b.WriteString(l.domain)
	for i, v := range vals {
		b.WriteByte('.')
		if l.valueToMetric[i] {
			b.WriteString(l.keys[i] + "_" + v)
		} else {
			b.WriteString(l.levels[i])
		}
	}
	return b.String()
}

// pathPart is s as one part of a Path, with pathSpecial escaped.
func pathPart(s string) string {
	if !strings.ContainsAny(s, pathSpecial) {
		return s
	}
	var b strings.Builder
	escapeTo(&b, s, pathSpecial)
	return b.String()
}

// Load reads the config at path: a YAML file, or every *.yaml and *.yml
// file of a directory, in name order. Every file must be valid, and no two
// may define one domain; the error of the first fault names its file, line
// and field.
func Load(path string) (*Config, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	files := []string{path}
	if info.IsDir() {
		entries, err := os.ReadDir(path)
		if err != nil {
			return nil, err
		}
		files = files[:0]
		for _, e := range entries {
			if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".yaml" || ext == ".yml") {
				files = append(files, filepath.Join(path, e.Name()))
			}
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("%s: no *.yaml or *.yml file", path)
		}
	}
	sources := make([]Source, len(files))
	for i, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		sources[i] = Source{Name: f, Data: data}
	}
	return Parse(sources...)
}

// Source is one config file's name and content.
type Source struct {
	Name string
	Data []byte
}

// Parse builds a config of the sources, each a YAML document of one
// domain, as [Load] does.
func Parse(sources ...Source) (*Config, error) {
	if len(sources) == 0 {
		return nil, errors.New("rlsconfig: no config")
	}
	c := &Config{domains: map[string]*Domain{}, limits: map[string]*Limit{}}
	where := map[string]string{}
	for _, s := range sources {
		d, err := parseFile(s.Name, s.Data, c.limits)
		if err != nil {
			return nil, err
		}
		if first, ok := where[d.Name]; ok {
			return nil, &Error{File: s.Name, Line: 1, Field: "domain", Msg: fmt.Sprintf("domain %q is defined in %s too", d.Name, first)}
		}
		where[d.Name] = s.Name
		c.domains[d.Name] = d
		c.Files = append(c.Files, s.Name)
	}
	return c, nil
}

// Error is a fault in a config file: where it is and what is wrong.
type Error struct {
	File  string
	Line  int
	Field string
	Msg   string
}

func (e *Error) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s:%d: %s: %s", e.File, e.Line, e.Field, e.Msg)
}

// units are the rate_limit units, by their names in the config, and the
// length of each as envoyproxy/ratelimit counts it (a month is 30 days, a
// year 365).
var units = map[string]struct {
	unit Unit
	len  time.Duration
}{
	"second": {rlspb.RateLimitResponse_RateLimit_SECOND, time.Second},
	"minute": {rlspb.RateLimitResponse_RateLimit_MINUTE, time.Minute},
	"hour":   {rlspb.RateLimitResponse_RateLimit_HOUR, time.Hour},
	"day":    {rlspb.RateLimitResponse_RateLimit_DAY, 24 * time.Hour},
	"week":   {rlspb.RateLimitResponse_RateLimit_WEEK, 7 * 24 * time.Hour},
	"month":  {rlspb.RateLimitResponse_RateLimit_MONTH, 30 * 24 * time.Hour},
	"year":   {rlspb.RateLimitResponse_RateLimit_YEAR, 365 * 24 * time.Hour},
}

// unitNames lists the units for an error, shortest first.
const unitNames = "second, minute, hour, day, week, month or year"

// UnitLength returns how long a unit is, as the config counts it, or 0
// for an unknown one.
func UnitLength(u Unit) time.Duration {
	for _, v := range units {
		if v.unit == u {
			return v.len
		}
	}
	return 0
}
