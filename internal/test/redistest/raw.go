package redistest

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// raw returns a plain client for looking at what a backend stored.
func raw(t *testing.T, top topology) redis.UniversalClient {
	var c redis.UniversalClient
	if top.cluster {
		c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: top.addrs, MaxRetries: -1})
	} else {
		c = redis.NewClient(&redis.Options{Addr: top.addrs[0], MaxRetries: -1})
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// uniqueKey returns a bucket key that no other test or run uses, so tests
// may share a server, even $SLUICE_REDIS_ADDR.
func uniqueKey(t *testing.T, name string) string {
	return fmt.Sprintf("redistest:%s:%d:%s", t.Name(), time.Now().UnixNano(), name)
}
