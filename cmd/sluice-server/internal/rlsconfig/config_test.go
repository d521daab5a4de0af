package rlsconfig_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/cmd/sluice-server/internal/rlsconfig"
	"github.com/sluicehq/sluice/cmd/sluice-server/internal/rlstest"
	"github.com/sluicehq/sluice/ratelimit"
)

func lookup(t *testing.T, cfg *rlsconfig.Config, domain string, kv ...string) *rlsconfig.Limit {
	t.Helper()
	d := cfg.Domain(domain)
	if d == nil {
		return nil
	}
	m, ok := d.Lookup(rlstest.Descriptor(kv...))
	if !ok {
		return nil
	}
	return m.Limit
}

// TestBasicConfig holds Lookup to envoyproxy/ratelimit's own expectations
// of its basic test config (test/config/config_test.go, TestBasicConfig).
func TestBasicConfig(t *testing.T) {
	cfg := rlstest.Config(t, "envoy/basic_config.yaml")
	const dom = "test-domain"
	if cfg.Domain("foo_domain") != nil {
		t.Error("an unknown domain was found")
	}
	for _, kv := range [][]string{
		{},
		{"key1", "something"},
		{"key1", "value1"},
		{"key2", "value2", "subkey", "subvalue"},
		{"key5", "value5", "subkey5", "subvalue"},
		{"key2", "value3"},
	} {
		if l := lookup(t, cfg, dom, kv...); l != nil {
			t.Errorf("%v: got limit %s, want none", kv, l.Path)
		}
	}
	for _, c := range []struct {
		kv   []string
		rpu  uint32
		unit rlspb.RateLimitResponse_RateLimit_Unit
		name string
	}{
		{[]string{"key1", "value1", "subkey1", "something"}, 5, rlspb.RateLimitResponse_RateLimit_SECOND, ""},
		{[]string{"key1", "value1", "subkey1", "subvalue1"}, 10, rlspb.RateLimitResponse_RateLimit_SECOND, ""},
		{[]string{"key2", "something"}, 20, rlspb.RateLimitResponse_RateLimit_MINUTE, ""},
		{[]string{"key2", "value2"}, 30, rlspb.RateLimitResponse_RateLimit_MINUTE, ""},
		{[]string{"key3", "foo"}, 1, rlspb.RateLimitResponse_RateLimit_HOUR, ""},
		{[]string{"key4", "foo"}, 1, rlspb.RateLimitResponse_RateLimit_DAY, "key4_rate_limit"},
		{[]string{"key5", "value5", "subkey5", "subvalue5"}, 25, rlspb.RateLimitResponse_RateLimit_DAY, ""},
		{[]string{"key7", "unspecified_value"}, 70, rlspb.RateLimitResponse_RateLimit_MINUTE, ""},
	} {
		l := lookup(t, cfg, dom, c.kv...)
		if l == nil {
			t.Errorf("%v: no limit", c.kv)
			continue
		}
		if l.RequestsPerUnit != c.rpu || l.Unit != c.unit || l.Name != c.name {
			t.Errorf("%v: got %d per %v named %q, want %d per %v named %q", c.kv, l.RequestsPerUnit, l.Unit, l.Name, c.rpu, c.unit, c.name)
		}
		if l.Config.Algorithm != ratelimit.FixedWindow || l.Config.Bandwidths[0].Capacity != int64(c.rpu) {
			t.Errorf("%v: config %+v, want a fixed window of %d", c.kv, l.Config, c.rpu)
		}
	}
	if l := lookup(t, cfg, dom, "key6", "foo"); l == nil || !l.Unlimited {
		t.Errorf("key6: got %+v, want unlimited", l)
	}
	if l := lookup(t, cfg, dom, "key7", "x"); l == nil || !l.DetailedMetric {
		t.Errorf("key7: got %+v, want detailed_metric", l)
	}
}

// TestWildcardConfig holds Lookup to envoyproxy/ratelimit's
// TestWildcardConfig: a value with '*' matches like a glob, after an exact
// value and before the key alone.
func TestWildcardConfig(t *testing.T) {
	cfg := rlstest.Config(t, "envoy/wildcard.yaml")
	const dom = "test-domain"
	same := func(a, b []string) {
		t.Helper()
		la, lb := lookup(t, cfg, dom, a...), lookup(t, cfg, dom, b...)
		if la == nil || la != lb {
			t.Errorf("%v and %v: got %v and %v, want one limit", a, b, la, lb)
		}
	}
	none := func(kv ...string) {
		t.Helper()
		if l := lookup(t, cfg, dom, kv...); l != nil {
			t.Errorf("%v: got %s, want none", kv, l.Path)
		}
	}
	same([]string{"noVal", "foo1"}, []string{"noVal", "foo2"})
	same([]string{"wild", "foo1"}, []string{"wild", "foo2"})
	if lookup(t, cfg, dom, "nestedWild", "val1", "wild", "goo2") == nil {
		t.Error("nestedWild/val1 wild/goo2: no limit")
	}
	none("wild", "bar")
	none("noWild", "foo1")
	same([]string{"midWild", "barab"}, []string{"midWild", "bar123b"})
	if l := lookup(t, cfg, dom, "midWild", "barab"); l == nil || l.Path != "test-domain.midWild_bar*b" {
		t.Errorf("midWild: got %v, want path test-domain.midWild_bar*b", l)
	}
	if lookup(t, cfg, dom, "midWild", "barb") == nil {
		t.Error("'*' must match the empty string: barb matches bar*b")
	}
	none("midWild", "bara")
	none("midWild", "xbarb")
	same([]string{"multiWild", "foo123bar456baz"}, []string{"multiWild", "foobarbaz"})
	none("multiWild", "foo123baz")
	none("multiWild", "bar456baz")
}

// TestBucketKeys checks that each set of values has a bucket of its own
// under each limit, that share_threshold shares one across a wildcard's
// values, and that keys stay within ratelimit.MaxKeyLen.
func TestBucketKeys(t *testing.T) {
	cfg, shared := rlstest.Config(t, "envoy/wildcard.yaml"), rlstest.Config(t, "envoy/share_threshold.yaml")
	key := func(dom string, kv ...string) string {
		t.Helper()
		c := cfg
		if dom == "share" {
			c, dom = shared, "test-domain"
		}
		m, ok := c.Domain(dom).Lookup(rlstest.Descriptor(kv...))
		if !ok {
			t.Fatalf("%v: no limit", kv)
		}
		return m.Key
	}
	a, b := key("test-domain", "wild", "foo1"), key("test-domain", "wild", "foo2")
	if a == b {
		t.Errorf("two values of a wildcard share bucket %q", a)
	}
	if a, b := key("share", "files", "files/a"), key("share", "files", "files/b"); a != b {
		t.Errorf("share_threshold: buckets %q and %q, want one", a, b)
	}
	if a, b := key("test-domain", "noVal", "x|y"), key("test-domain", "noVal", "x%7Cy"); a == b {
		t.Errorf("values x|y and x%%7Cy share bucket %q", a)
	}
	long := key("test-domain", "noVal", strings.Repeat("v", 2*ratelimit.MaxKeyLen))
	// A value cannot pass for the hash of values too long to write out.
	_, hash, _ := strings.Cut(long, "|")
	if forged := key("test-domain", "noVal", hash); forged == long {
		t.Errorf("the value %q shares the bucket of the long value's hash, %q", hash, long)
	}
	if len(long) > ratelimit.MaxKeyLen || long == key("test-domain", "noVal", strings.Repeat("v", 2*ratelimit.MaxKeyLen-1)) {
		t.Errorf("long values: key %q", long)
	}
	if c := cfg.ClassOf(a); c != "test-domain.wild_foo*" {
		t.Errorf("ClassOf(%q) = %q, want the limit's path", a, c)
	}
}

// TestShadowMode holds the shadow_mode flags to envoyproxy/ratelimit's
// TestShadowModeConfig.
func TestShadowMode(t *testing.T) {
	cfg := rlstest.Config(t, "envoy/shadowmode_config.yaml")
	for _, c := range []struct {
		kv     []string
		shadow bool
	}{
		{[]string{"key1", "value1", "subkey1", "something"}, false},
		{[]string{"key1", "value1", "subkey1", "subvalue1"}, true},
		{[]string{"key2", "something"}, true},
		{[]string{"key2", "value2"}, false},
	} {
		if l := lookup(t, cfg, "test-domain", c.kv...); l == nil || l.ShadowMode != c.shadow {
			t.Errorf("%v: got %+v, want shadow_mode %t", c.kv, l, c.shadow)
		}
	}
}

// TestBadConfigs holds the errors of envoyproxy/ratelimit's bad test
// configs, and sluice's own fields', to the file, line and field.
func TestBadConfigs(t *testing.T) {
	for _, c := range []struct {
		file string
		want string // the error's start: file:line: field
	}{
		{"envoy/bad_limit_unit.yaml", "envoy/bad_limit_unit.yaml:9: descriptors[0].rate_limit.unit: \"foo\" is not a unit"},
		{"envoy/bad_yaml.yaml", "envoy/bad_yaml.yaml:"},
		{"envoy/empty_domain.yaml", "envoy/empty_domain.yaml:4: domain: missing"},
		{"envoy/empty_key.yaml", "envoy/empty_key.yaml:"},
		{"envoy/duplicate_key.yaml", "envoy/duplicate_key.yaml:"},
		{"envoy/misspelled_key.yaml", "envoy/misspelled_key.yaml:8: descriptors[0].ratelimit: unknown field"},
		{"envoy/misspelled_key2.yaml", "envoy/misspelled_key2.yaml:"},
		{"envoy/non_map_list.yaml", "envoy/non_map_list.yaml:6: descriptors[0]: must be a mapping"},
		{"envoy/non_string_key.yaml", "envoy/non_string_key.yaml:4: key 0.25 is not a string"},
		{"envoy/replaces_empty.yaml", "envoy/replaces_empty.yaml:"},
		{"envoy/replaces_self.yaml", "envoy/replaces_self.yaml:"},
		{"envoy/unlimited_with_unit.yaml", "envoy/unlimited_with_unit.yaml:"},
	} {
		data, err := os.ReadFile(filepath.Join("testdata", c.file))
		if err != nil {
			t.Fatal(err)
		}
		_, err = rlsconfig.Parse(rlsconfig.Source{Name: c.file, Data: data})
		var ce *rlsconfig.Error
		if !errors.As(err, &ce) || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an *Error starting %q", c.file, err, c.want)
		}
	}
	t.Run("duplicate domain", func(t *testing.T) {
		a := rlsconfig.Source{Name: "a.yaml", Data: []byte("domain: d\n")}
		b := rlsconfig.Source{Name: "b.yaml", Data: []byte("domain: d\n")}
		if _, err := rlsconfig.Parse(a, b); err == nil || !strings.Contains(err.Error(), "a.yaml") {
			t.Errorf("got %v, want an error naming both files", err)
		}
	})
}

// TestSluiceFields checks sluice's own fields: algorithm, burst,
// bandwidths, plan, shards and fail_mode, and the errors of bad ones.
func TestSluiceFields(t *testing.T) {
	good := `
domain: d
fail_mode: local
descriptors:
  - key: tb
    rate_limit: {algorithm: TokenBucket, unit: second, requests_per_unit: 10, burst: 50}
  - key: bw
    rate_limit:
      name: tenant
      bandwidths:
        - {id: burst, capacity: 20, refill_tokens: 10, refill_period: 1s}
        - {id: hourly, capacity: 1000, refill_tokens: 1000, refill_period: 1h}
  - key: plan
    rate_limit: {plan: true, shards: 4}
  - key: block
    rate_limit: {unit: minute, requests_per_unit: 0}
`
	cfg, err := rlsconfig.Parse(rlsconfig.Source{Name: "good.yaml", Data: []byte(good)})
	if err != nil {
		t.Fatal(err)
	}
	d := cfg.Domain("d")
	if d.FailMode != "local" || !d.HasPlans() {
		t.Errorf("domain: fail mode %q, plans %t", d.FailMode, d.HasPlans())
	}
	tb := lookup(t, cfg, "d", "tb", "x")
	want := ratelimit.Every(time.Second, 10).WithBurst(50)
	if tb.Config.Algorithm != ratelimit.TokenBucket || tb.Config.Bandwidths[0] != want {
		t.Errorf("tb: %+v, want a token bucket of %+v", tb.Config, want)
	}
	bw := lookup(t, cfg, "d", "bw", "x")
	if len(bw.Config.Bandwidths) != 2 || bw.Config.Algorithm != ratelimit.TokenBucket ||
		bw.Unit != rlspb.RateLimitResponse_RateLimit_SECOND || bw.RequestsPerUnit != 10 {
		t.Errorf("bw: %+v", bw)
	}
	if p := lookup(t, cfg, "d", "plan", "acme"); !p.Plan || p.Shards != 4 {
		t.Errorf("plan: %+v", p)
	}
	if b := lookup(t, cfg, "d", "block", "x"); !b.Blocked() {
		t.Errorf("block: %+v, want Blocked", b)
	}

	for _, c := range []struct{ name, yaml, want string }{
		{"bad algorithm", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: Magic, unit: second, requests_per_unit: 1}\n",
			"x.yaml:4: descriptors[0].rate_limit.algorithm: Algorithm \"Magic\" is not a known Algorithm"},
		{"bad fail mode", "domain: d\nfail_mode: maybe\n", "x.yaml:2: fail_mode: \"maybe\" is not one of open, closed, local, error"},
		{"bandwidths with unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      bandwidths: [{capacity: 1, refill_tokens: 1, refill_period: 1s}]\n",
			"x.yaml:5: descriptors[0].rate_limit.unit: not allowed with bandwidths"},
		{"bad bandwidth", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      bandwidths: [{capacity: 1, refill_tokens: 1, refill_period: soon}]\n",
			"x.yaml:5: descriptors[0].rate_limit.bandwidths[0].refill_period: "},
		{"shards of 1", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {plan: true, shards: 1}\n",
			"x.yaml:4: descriptors[0].rate_limit.shards: must be a whole number from 2 to 64"},
		{"burst of a window", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10, burst: 50}\n",
			"x.yaml:4: descriptors[0].rate_limit.burst: not allowed with FixedWindow"},
		{"share without wildcard", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
			"x.yaml:3: descriptors[0].share_threshold: needs a value with a wildcard"},
		{"field given twice", "domain: d\ndomain: e\n", "x.yaml:2: domain: given twice"},
		{"negative rate", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
			"x.yaml:4: descriptors[0].rate_limit.requests_per_unit: must be a whole number from 0 to 4294967295"},
		{"empty file", "", "x.yaml:1: the file is empty"},
	} {
		_, err := rlsconfig.Parse(rlsconfig.Source{Name: "x.yaml", Data: []byte(c.yaml)})
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error starting %q", c.name, err, c.want)
		}
	}
}

// TestLoadDirectory loads every YAML file of a directory, and refuses the
// set when one is bad.
func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\n")
	write("b.yml", "domain: b\n")
	write("notes.txt", "not a config")
	cfg, err := rlsconfig.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Domains(), ","); got != "a,b" {
		t.Errorf("domains %q, want a,b", got)
	}
	write("c.yaml", "domain: [oops\n")
	if _, err := rlsconfig.Load(dir); err == nil || !strings.Contains(err.Error(), "c.yaml") {
		t.Errorf("a bad file in the directory: got %v, want its error", err)
	}
}

// FuzzParse holds Parse to an *Error or a config for any input, never a
// panic, and Lookup on what it loads to no panic either.
func FuzzParse(f *testing.F) {
	for _, name := range []string{"envoy/basic_config.yaml", "envoy/wildcard.yaml", "envoy/share_threshold.yaml", "envoy/bad_yaml.yaml"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data, "key1", "value1")
	}
	f.Fuzz(func(t *testing.T, data []byte, key, value string) {
		cfg, err := rlsconfig.Parse(rlsconfig.Source{Name: "f.yaml", Data: data})
		if err != nil {
			var ce *rlsconfig.Error
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is not an *Error", err)
			}
			return
		}
		for _, name := range cfg.Domains() {
			if m, ok := cfg.Domain(name).Lookup(rlstest.Descriptor(key, value, key, value)); ok {
				if len(m.Key) > ratelimit.MaxKeyLen || cfg.ClassOf(m.Key) == "" {
					t.Fatalf("key %q: too long, or no class", m.Key)
				}
			}
		}
	})
}

// TestMetadata holds descriptors' metadata and quota_mode to
// envoyproxy/ratelimit's TestMetadata.
func TestMetadata(t *testing.T) {
	cfg := rlstest.Config(t, "envoy/metadata.yaml")
	l := lookup(t, cfg, "test-domain", "key1", "value1", "subkey1", "something")
	if l == nil || l.RequestsPerUnit != 5 || l.Metadata.GetFields()["name"].GetStringValue() != "service_1" {
		t.Errorf("key1_value1.subkey1: %+v, want 5 a second with name service_1", l)
	}
	l = lookup(t, cfg, "test-domain", "key2", "something")
	if l == nil || l.RequestsPerUnit != 20 ||
		l.Metadata.GetFields()["service_with_quota"].GetStructValue().GetFields()["name"].GetStringValue() != "service_2" {
		t.Errorf("key2: %+v, want 20 a minute with service_with_quota.name service_2", l)
	}
	if l := lookup(t, cfg, "test-domain", "key1", "value1", "subkey1", "subvalue1"); l == nil || l.Metadata != nil {
		t.Errorf("key1_value1.subkey1_subvalue1: %+v, want a limit without metadata", l)
	}
	q, err := rlsconfig.Parse(rlsconfig.Source{Name: "q.yaml", Data: []byte("domain: q\ndescriptors:\n  - key: k\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")})
	if err != nil {
		t.Fatal(err)
	}
	if l := lookup(t, q, "q", "k", "v"); l == nil || !l.QuotaMode {
		t.Errorf("quota_mode: %+v", l)
	}
	if _, err := rlsconfig.Parse(rlsconfig.Source{Name: "m.yaml", Data: []byte("domain: m\ndescriptors:\n  - key: k\n    metadata: [a, b]\n")}); err == nil ||
		!strings.HasPrefix(err.Error(), "m.yaml:4: descriptors[0].metadata: must be a mapping") {
		t.Errorf("metadata of a list: %v", err)
	}
}
