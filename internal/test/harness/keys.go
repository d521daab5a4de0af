package harness

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Keys returns the keys that start with prefix on every master c reaches,
// by SCAN, up to limit of them (0: all).
func Keys(ctx context.Context, c redis.UniversalClient, prefix string, limit int) ([]string, error) {
	return keys(ctx, c, globEscaper.Replace(prefix)+"*", limit)
}

// KeysContaining returns the keys that contain s on every master c
// reaches, by SCAN, up to limit of them (0: all).
func KeysContaining(ctx context.Context, c redis.UniversalClient, s string, limit int) ([]string, error) {
	return keys(ctx, c, "*"+globEscaper.Replace(s)+"*", limit)
}

// Clean deletes the keys that start with prefix on every master c
// reaches, one UNLINK each (a cluster node's keys may lie in many slots),
// and returns how many it deleted.
func Clean(ctx context.Context, c redis.UniversalClient, prefix string) (int, error) {
	return clean(ctx, c, globEscaper.Replace(prefix)+"*")
}

// CleanContaining deletes the keys that contain s on every master c
// reaches, as [Clean] does, and returns how many it deleted.
func CleanContaining(ctx context.Context, c redis.UniversalClient, s string) (int, error) {
	return clean(ctx, c, "*"+globEscaper.Replace(s)+"*")
}

// keys returns the keys that match the SCAN pattern on every master c
// reaches, up to limit of them (0: all).
func keys(ctx context.Context, c redis.UniversalClient, pattern string, limit int) ([]string, error) {
	var keys []string
	err := forEachMaster(ctx, c, func(ctx context.Context, node *redis.Client) error {
		return scan(ctx, node, pattern, func(key string) bool {
			if limit > 0 && len(keys) == limit {
				return false
			}
			keys = append(keys, key)
			return true
		})
	})
	return keys, err
}

// clean deletes the keys that match the SCAN pattern on every master c
// reaches, and returns how many it deleted.
func clean(ctx context.Context, c redis.UniversalClient, pattern string) (int, error) {
	var deleted int
	err := forEachMaster(ctx, c, func(ctx context.Context, node *redis.Client) error {
		pipe := node.Pipeline()
		if err := scan(ctx, node, pattern, func(key string) bool {
			pipe.Unlink(ctx, key)
			return true
		}); err != nil {
			return err
		}
		if pipe.Len() == 0 {
			return nil
		}
		cmds, err := pipe.Exec(ctx)
		if err != nil {
			return fmt.Errorf("harness: UNLINK on %s: %w", node.Options().Addr, err)
		}
		for _, cmd := range cmds {
			deleted += int(cmd.(*redis.IntCmd).Val())
		}
		return nil
	})
	return deleted, err
}

// scan calls each with the keys that match the SCAN pattern on node, until
// each returns false.
func scan(ctx context.Context, node *redis.Client, pattern string, each func(key string) bool) error {
	iter := node.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		if !each(iter.Val()) {
			return nil
		}
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("harness: SCAN %s: %w", node.Options().Addr, err)
	}
	return nil
}

// forEachMaster calls f with each master of a cluster client one after
// another, or with c itself.
func forEachMaster(ctx context.Context, c redis.UniversalClient, f func(context.Context, *redis.Client) error) error {
	switch c := c.(type) {
	case *redis.ClusterClient:
		// ForEachMaster calls its function on the masters concurrently;
		// f runs on one at a time, so that it need not lock.
		var (
			mu      sync.Mutex
			masters []*redis.Client
		)
		if err := c.ForEachMaster(ctx, func(_ context.Context, node *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			masters = append(masters, node)
			return nil
		}); err != nil {
			return err
		}
		for _, m := range masters {
			if err := f(ctx, m); err != nil {
				return err
			}
		}
		return nil
	case *redis.Client:
		return f(ctx, c)
	}
	return fmt.Errorf("harness: %T is neither a *redis.Client nor a *redis.ClusterClient", c)
}

// globEscaper escapes the characters SCAN's MATCH pattern gives a meaning.
var globEscaper = strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)
