package rlsconfig

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/sharding"
)

// MaxPathLen is the longest Path a limit may have, in bytes, so that its
// bucket keys stay within ratelimit.MaxKeyLen with room for the values.
const MaxPathLen = 256

// epoch anchors the windows of a FixedWindow limit written as
// envoyproxy/ratelimit writes them: aligned to the unit, as its counters'
// windows are (a minute's window starts on the minute).
var epoch = time.Unix(0, 0)

// parser reads one file. Each method returns the first fault it finds.
type parser struct {
	file   string
	limits map[string]*Limit
	plans  bool // a plan limit was read
}

func (p *parser) fault(n *yaml.Node, field, format string, args ...any) error {
	return &Error{File: p.file, Line: n.Line, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// parseFile reads one file's domain, adding its limits to limits by Path.
func parseFile(file string, data []byte, limits map[string]*Limit) (*Domain, error) {
	p := &parser{file: file, limits: limits}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, &Error{File: file, Line: yamlErrorLine(err), Msg: "not YAML: " + err.Error()}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, &Error{File: file, Line: 1, Msg: "the file is empty: it needs a domain and its descriptors"}
	}
	return p.domain(doc.Content[0])
}

// yamlErrorLine is the line a YAML error names, or 1.
func yamlErrorLine(err error) int {
	var te *yaml.TypeError
	msg := err.Error()
	if errors.As(err, &te) && len(te.Errors) > 0 {
		msg = te.Errors[0]
	}
	if _, rest, ok := strings.Cut(msg, "line "); ok {
		end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
		if end < 0 {
			end = len(rest)
		}
		if n, err := strconv.Atoi(rest[:end]); err == nil {
			return n
		}
	}
	return 1
}

// fields calls each for each key of mapping n in turn, after checking that
// n is a mapping, that every key is one of allowed and that none is
// repeated.
func (p *parser) fields(n *yaml.Node, field string, allowed []string, each func(key string, v *yaml.Node) error) error {
	if n.Kind != yaml.MappingNode {
		return p.fault(n, field, "must be a mapping of %s", strings.Join(allowed, ", "))
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name := join(field, k.Value)
		if k.Kind != yaml.ScalarNode || k.Tag != "!!str" {
			return p.fault(k, field, "key %s is not a string", k.Value)
		}
		if !slices.Contains(allowed, k.Value) {
			return p.fault(k, name, "unknown field (known here: %s)", strings.Join(allowed, ", "))
		}
		if seen[k.Value] {
			return p.fault(k, name, "given twice")
		}
		seen[k.Value] = true
		if err := each(k.Value, v); err != nil {
			return err
		}
	}
	return nil
}

func join(field, key string) string {
	if field == "" {
		return key
	}
	return field + "." + key
}

// str reads a scalar as text: a key or value may be written as a number.
func (p *parser) str(n *yaml.Node, field string) (string, error) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		return "", p.fault(n, field, "must be a string")
	}
	return n.Value, nil
}

func (p *parser) boolean(n *yaml.Node, field string) (bool, error) {
	var b bool
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" || n.Decode(&b) != nil {
		return false, p.fault(n, field, "must be true or false, got %q", n.Value)
	}
	return b, nil
}

// integer reads a whole number from lo to hi.
func (p *parser) integer(n *yaml.Node, field string, lo, hi int64) (int64, error) {
	v, err := strconv.ParseInt(n.Value, 10, 64)
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || err != nil || v < lo || v > hi {
		return 0, p.fault(n, field, "must be a whole number from %d to %d, got %q", lo, hi, n.Value)
	}
	return v, nil
}

func (p *parser) list(n *yaml.Node, field string) ([]*yaml.Node, error) {
	if n.Kind != yaml.SequenceNode {
		return nil, p.fault(n, field, "must be a list")
	}
	return n.Content, nil
}

var domainFields = []string{"domain", "descriptors", "fail_mode"}

func (p *parser) domain(n *yaml.Node) (*Domain, error) {
	d := &Domain{root: node{children: map[string]*node{}}}
	var descriptors *yaml.Node
	err := p.fields(n, "", domainFields, func(key string, v *yaml.Node) (err error) {
		switch key {
		case "domain":
			d.Name, err = p.str(v, key)
		case "fail_mode":
			if d.FailMode, err = p.str(v, key); err == nil && !slices.Contains(FailModes, d.FailMode) {
				err = p.fault(v, key, "%q is not one of %s", d.FailMode, strings.Join(FailModes, ", "))
			}
		case "descriptors":
			descriptors = v
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if d.Name == "" {
		return nil, p.fault(n, "domain", "missing: a config file needs a domain")
	}
	if descriptors != nil {
		path := []string{pathPart(d.Name)}
		if err := p.descriptors(descriptors, "descriptors", &d.root, path, nil, nil); err != nil {
			return nil, err
		}
	}
	d.plans = p.plans
	return d, nil
}

var descriptorFields = []string{
	"key", "value", "rate_limit", "descriptors", "shadow_mode", "detailed_metric",
	"value_to_metric", "share_threshold", "quota_mode", "metadata",
}

// descriptors reads a list of descriptors into the children of parent,
// at path (the levels above), where keys are the levels' keys alone and
// toMetric their value_to_metric.
func (p *parser) descriptors(n *yaml.Node, field string, parent *node, path, keys []string, toMetric []bool) error {
	items, err := p.list(n, field)
	if err != nil {
		return err
	}
	for i, item := range items {
		if err := p.descriptor(item, fmt.Sprintf("%s[%d]", field, i), parent, path, keys, toMetric); err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) descriptor(n *yaml.Node, field string, parent *node, path, keys []string, toMetric []bool) error {
	var (
		key, value            string
		hasKey                bool
		rateLimit, children   *yaml.Node
		shadow, detailed      bool
		valueToMetric, shared bool
		quota                 bool
		metadata              *structpb.Struct
	)
	err := p.fields(n, field, descriptorFields, func(k string, v *yaml.Node) (err error) {
		name := join(field, k)
		switch k {
		case "key":
			key, err = p.str(v, name)
			hasKey = true
		case "value":
			value, err = p.str(v, name)
		case "rate_limit":
			rateLimit = v
		case "descriptors":
			children = v
		case "shadow_mode":
			shadow, err = p.boolean(v, name)
		case "detailed_metric":
			detailed, err = p.boolean(v, name)
		case "value_to_metric":
			valueToMetric, err = p.boolean(v, name)
		case "share_threshold":
			shared, err = p.boolean(v, name)
		case "quota_mode":
			quota, err = p.boolean(v, name)
		case "metadata":
			metadata, err = p.metadata(v, name)
		}
		return err
	})
	if err != nil {
		return err
	}
	if !hasKey || key == "" {
		return p.fault(n, join(field, "key"), "missing: a descriptor needs a key")
	}
	name := key
	if value != "" {
		name += "_" + value
	}
	if _, dup := parent.children[name]; dup {
		return p.fault(n, field, "a descriptor of key %q and value %q is already defined at this level", key, value)
	}
	if shared && !strings.Contains(name, "*") {
		return p.fault(n, join(field, "share_threshold"), "needs a value with a wildcard ('*')")
	}
	child := &node{children: map[string]*node{}, share: shared, pattern: value}
	path = append(slices.Clip(path), pathPart(name))
	keys = append(slices.Clip(keys), pathPart(key))
	toMetric = append(slices.Clip(toMetric), valueToMetric && !shared)
	if len(strings.Join(path, ".")) > MaxPathLen {
		return p.fault(n, field, "the descriptor's path is longer than %d bytes", MaxPathLen)
	}
	if rateLimit != nil {
		l, err := p.rateLimit(rateLimit, join(field, "rate_limit"))
		if err != nil {
			return err
		}
		l.ShadowMode, l.DetailedMetric, l.QuotaMode, l.Metadata = shadow, detailed, quota, metadata
		l.domain, l.levels, l.keys, l.valueToMetric = path[0], path[1:], keys, toMetric
		l.Path = strings.Join(path, ".")
		p.limits[l.Path] = l
		p.plans = p.plans || l.Plan
		child.limit = l
	}
	if children != nil {
		if err := p.descriptors(children, join(field, "descriptors"), child, path, keys, toMetric); err != nil {
			return err
		}
	}
	parent.children[name] = child
	if strings.Contains(name, "*") {
		parent.wildcards = append(parent.wildcards, wildcard{name: name, parts: strings.Split(name, "*")})
	}
	return nil
}

var rateLimitFields = []string{
	"unit", "requests_per_unit", "unlimited", "name", "replaces",
	"algorithm", "burst", "bandwidths", "plan", "shards",
}

// rateLimit reads a rate_limit. Its fields come in three forms:
// envoyproxy/ratelimit's unit and requests_per_unit (with sluice's
// algorithm and burst), sluice's bandwidths (with algorithm), or sluice's
// plan; unlimited takes none of them.
func (p *parser) rateLimit(n *yaml.Node, field string) (*Limit, error) {
	l := &Limit{File: p.file, Line: n.Line}
	given := map[string]*yaml.Node{}
	var (
		unit       string
		rpu, burst int64
		alg        = ratelimit.FixedWindow
		bandwidths []ratelimit.Bandwidth
	)
	err := p.fields(n, field, rateLimitFields, func(k string, v *yaml.Node) (err error) {
		name := join(field, k)
		given[k] = v
		switch k {
		case "unit":
			unit, err = p.str(v, name)
			if _, ok := units[strings.ToLower(unit)]; err == nil && !ok {
				err = p.fault(v, name, "%q is not a unit: one of %s", unit, unitNames)
			}
		case "requests_per_unit":
			rpu, err = p.integer(v, name, 0, math.MaxUint32)
		case "unlimited":
			l.Unlimited, err = p.boolean(v, name)
		case "name":
			l.Name, err = p.str(v, name)
		case "replaces":
			l.Replaces, err = p.replaces(v, name)
		case "algorithm":
			var s string
			if s, err = p.str(v, name); err == nil {
				if alg, err = plans.ParseAlgorithm(s); err != nil {
					err = p.fault(v, name, "%s", reason(err))
				}
			}
		case "burst":
			burst, err = p.integer(v, name, 1, ratelimit.MaxCapacity)
		case "bandwidths":
			bandwidths, err = p.bandwidths(v, name)
		case "plan":
			l.Plan, err = p.boolean(v, name)
		case "shards":
			var s int64
			s, err = p.integer(v, name, 2, sharding.MaxSubBuckets)
			l.Shards = int(s)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, r := range l.Replaces {
		if r == l.Name {
			return nil, p.fault(given["replaces"], join(field, "replaces"), "names the limit itself (%q)", r)
		}
	}
	// Which fields go together.
	only := func(form string, allowed ...string) error {
		for _, k := range rateLimitFields {
			if v, ok := given[k]; ok && !slices.Contains(allowed, k) {
				return p.fault(v, join(field, k), "not allowed with %s", form)
			}
		}
		return nil
	}
	common := []string{"name", "replaces"}
	switch {
	case l.Unlimited:
		if err := only("unlimited: true", append(common, "unlimited")...); err != nil {
			return nil, err
		}
		return l, nil
	case l.Plan:
		if err := only("plan: true", append(common, "plan", "shards")...); err != nil {
			return nil, err
		}
		return l, nil
	case bandwidths != nil:
		if err := only("bandwidths", append(common, "bandwidths", "algorithm", "shards", "plan", "unlimited")...); err != nil {
			return nil, err
		}
		if given["algorithm"] == nil {
			alg = ratelimit.TokenBucket
		}
		l.Config = ratelimit.Config{Algorithm: alg, Bandwidths: bandwidths}
		l.Unit, l.RequestsPerUnit = Reported(bandwidths[0])
	default:
		if given["unit"] == nil {
			return nil, p.fault(n, join(field, "unit"), "missing: a rate_limit needs a unit and requests_per_unit, bandwidths, plan: true or unlimited: true")
		}
		u := units[strings.ToLower(unit)]
		l.Unit, l.RequestsPerUnit = u.unit, uint32(rpu)
		if rpu == 0 {
			if err := only("requests_per_unit: 0", append(common, "unit", "requests_per_unit", "algorithm", "plan", "unlimited")...); err != nil {
				return nil, err
			}
			return l, nil
		}
		if b := given["burst"]; b != nil && alg != ratelimit.TokenBucket && alg != ratelimit.GCRA && alg != ratelimit.LeakyBucket {
			return nil, p.fault(b, join(field, "burst"), "not allowed with %v, which counts requests in windows: burst is for TokenBucket, GCRA and LeakyBucket", alg)
		}
		bw := ratelimit.Every(u.len, rpu)
		if alg == ratelimit.FixedWindow {
			bw = bw.AlignedTo(epoch)
		}
		if burst != 0 {
			bw = bw.WithBurst(burst)
		}
		l.Config = ratelimit.Config{Algorithm: alg, Bandwidths: []ratelimit.Bandwidth{bw}}
	}
	if err := l.Config.Validate(); err != nil {
		return nil, p.fault(n, field, "%s", reason(err))
	}
	if bws := l.Config.Bandwidths; l.Name != "" && len(bws) == 1 && bws[0].ID == "" {
		// The name names the bandwidth in the response headers, if it is
		// one a bandwidth's ID may be.
		named := l.Config
		named.Bandwidths = []ratelimit.Bandwidth{bws[0].WithID(l.Name)}
		if named.Validate() == nil {
			l.Config = named
		}
	}
	return l, nil
}

// metadata reads a descriptor's metadata, any mapping, as the struct a
// response's dynamic metadata carries.
func (p *parser) metadata(n *yaml.Node, field string) (*structpb.Struct, error) {
	if n.Kind != yaml.MappingNode {
		return nil, p.fault(n, field, "must be a mapping")
	}
	var m map[string]any
	if err := n.Decode(&m); err != nil {
		return nil, p.fault(n, field, "%v", err)
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		return nil, p.fault(n, field, "%v", err)
	}
	return s, nil
}

func (p *parser) replaces(n *yaml.Node, field string) ([]string, error) {
	items, err := p.list(n, field)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(items))
	for i, item := range items {
		f := fmt.Sprintf("%s[%d]", field, i)
		err := p.fields(item, f, []string{"name"}, func(_ string, v *yaml.Node) (err error) {
			names[i], err = p.str(v, join(f, "name"))
			return err
		})
		if err != nil {
			return nil, err
		}
		if names[i] == "" {
			return nil, p.fault(item, join(f, "name"), "missing: each replaces entry names a limit")
		}
	}
	return names, nil
}

// bandwidths reads a list of bandwidths in the form a plan's bandwidths
// column holds (package plans): id, capacity, refill_tokens,
// refill_period, refill, initial_tokens and aligned_start.
func (p *parser) bandwidths(n *yaml.Node, field string) ([]ratelimit.Bandwidth, error) {
	var v any
	if err := n.Decode(&v); err != nil {
		return nil, p.fault(n, field, "%v", err)
	}
	if _, ok := v.([]any); !ok || len(v.([]any)) == 0 {
		return nil, p.fault(n, field, "must be a list of at least one bandwidth")
	}
	data, err := json.Marshal(v)
	if err != nil {
		return nil, p.fault(n, field, "%v", err)
	}
	bws, err := plans.ParseBandwidths(data)
	if err != nil {
		// "bandwidths[1].refill_period: time: invalid duration", named from
		// the list's own field.
		where, msg, _ := strings.Cut(reason(err), ": ")
		return nil, p.fault(n, strings.TrimSuffix(field, "bandwidths")+where, "%s", msg)
	}
	return bws, nil
}

// reason is err's message without the sentinel error's prefix that the
// config's own errors do not need.
func reason(err error) string {
	msg := err.Error()
	for _, prefix := range []string{ratelimit.ErrInvalidConfig.Error() + ": ", plans.ErrInvalidPlan.Error() + ": "} {
		msg = strings.TrimPrefix(msg, prefix)
	}
	return msg
}

// Reported is bandwidth bw as a response's current_limit reports it: its
// rate over the shortest unit no shorter than its refill period, rounded
// down (but at least 1), or per year when it refills more slowly.
func Reported(bw ratelimit.Bandwidth) (Unit, uint32) {
	order := []string{"second", "minute", "hour", "day", "week", "month", "year"}
	for i, name := range order {
		u := units[name]
		if u.len >= bw.RefillPeriod || i == len(order)-1 {
			perUnit := float64(bw.RefillTokens) * float64(u.len) / float64(bw.RefillPeriod)
			return u.unit, uint32(min(max(perUnit, 1), math.MaxUint32))
		}
	}
	return rlspb.RateLimitResponse_RateLimit_UNKNOWN, 0
}
