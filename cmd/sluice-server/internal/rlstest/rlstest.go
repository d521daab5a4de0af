// Package rlstest builds RLS v3 requests and configs for sluice-server's
// tests.
package rlstest

import (
	"os"
	"path/filepath"
	"testing"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/cmd/sluice-server/internal/rlsconfig"
)

// Descriptor is a descriptor of the entries key, value, key, value...;
// a key without its value is dropped.
func Descriptor(kv ...string) *commonpb.RateLimitDescriptor {
	d := &commonpb.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonpb.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// Request is a request of domain with a descriptor of each list of
// key, value pairs.
func Request(domain string, descs ...[]string) *rlspb.RateLimitRequest {
	req := &rlspb.RateLimitRequest{Domain: domain}
	for _, kv := range descs {
		req.Descriptors = append(req.Descriptors, Descriptor(kv...))
	}
	return req
}

// Config is the config of the test's files, read from its package's
// testdata directory; a fault in them fails the test.
func Config(t testing.TB, files ...string) *rlsconfig.Config {
	t.Helper()
	var sources []rlsconfig.Source
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join("testdata", f))
		if err != nil {
			t.Fatal(err)
		}
		sources = append(sources, rlsconfig.Source{Name: f, Data: data})
	}
	cfg, err := rlsconfig.Parse(sources...)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
