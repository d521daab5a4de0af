package redistest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

// testFailures: a closed client, a hung server, a dead one, and keys that
// hold what sluice did not write all give errors wrapping the right
// sentinel, never a panic; bad input is refused before any I/O.
func testFailures(t *testing.T, a Adapter) {
	ctx := context.Background()
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(10)}}
	take := ratelimit.Request{Tokens: 1}

	t.Run("ClosedClient", func(t *testing.T) {
		t.Parallel()
		addr, _ := servers.StandaloneAddr(t)
		b, closeClient := a.Connect(t, []string{addr}, false, Options{})
		closeClient()
		_, err := b.Do(ctx, uniqueKey(t, "k"), cfg, take)
		if !errors.Is(err, ratelimit.ErrBackendUnavailable) {
			t.Fatalf("Do on a closed client: %v; want ErrBackendUnavailable", err)
		}
		if _, err := b.Do(ctx, "", cfg, take); !errors.Is(err, ratelimit.ErrInvalidKey) {
			t.Fatalf("Do with an empty key on a closed client: %v; want ErrInvalidKey, found before any I/O", err)
		}
		if _, err := b.Do(ctx, "k", ratelimit.Config{}, take); !errors.Is(err, ratelimit.ErrInvalidConfig) {
			t.Fatalf("Do with no bandwidths: %v; want ErrInvalidConfig", err)
		}
	})

	t.Run("PausedServer", func(t *testing.T) {
		t.Parallel()
		r := servers.StartRedis(t)
		b, _ := a.Connect(t, []string{r.Addr()}, false, Options{})
		key := uniqueKey(t, "k")
		if _, err := b.Do(ctx, key, cfg, take); err != nil {
			t.Fatal(err)
		}
		r.Pause(t)
		tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		start := time.Now()
		_, err := b.Do(tctx, key, cfg, take)
		cancel()
		elapsed := time.Since(start)
		r.Resume(t)
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ratelimit.ErrTimeout) {
			t.Fatalf("Do on a paused server: %v; want the caller's context.DeadlineExceeded, not ErrTimeout", err)
		}
		if elapsed > 2*time.Second {
			t.Errorf("Do on a paused server returned after %v; want about the context's 200ms", elapsed)
		}
		if _, err := eventually(t, func() (ratelimit.Decision, error) { return b.Do(ctx, key, cfg, take) }); err != nil {
			t.Fatalf("Do after Resume: %v", err)
		}
	})

	t.Run("KilledServer", func(t *testing.T) {
		t.Parallel()
		r := servers.StartRedis(t)
		b, _ := a.Connect(t, []string{r.Addr()}, false, Options{})
		r.Kill(t)
		_, err := b.Do(ctx, uniqueKey(t, "k"), cfg, take)
		if !errors.Is(err, ratelimit.ErrBackendUnavailable) {
			t.Fatalf("Do on a dead server: %v; want ErrBackendUnavailable", err)
		}
	})

	t.Run("ForeignValues", func(t *testing.T) {
		t.Parallel()
		addr, _ := servers.StandaloneAddr(t)
		top := topology{addrs: []string{addr}}
		b, _ := a.Connect(t, top.addrs, false, Options{})
		c := raw(t, top)
		type foreign struct {
			name, value, want string
		}
		cases := []foreign{
			{"truncated", "\x10\x00\x00\x00\x00\x00\x00\x00\x00\xff", "corrupt state"},
			{"trailing", "\x10\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x11\x01\x01\x01\x01\x00ab", "corrupt state"},
		}
		// Every algorithm refuses what sluice did not write, and leaves it.
		for alg := range ratelimit.Algorithm(numAlgorithms) {
			str, hash, zset := "did not write", "WRONGTYPE", "did not write"
			switch alg {
			case ratelimit.SlidingWindowLog:
				hash = "did not write"
			case ratelimit.LeakyBucket:
				str = "corrupt state" // 'h' is the first byte of its own states
			}
			cases = append(cases, foreign{alg.String() + "/string", "hello", str},
				foreign{alg.String() + "/hash", "", hash},
				// Not a sliding log's: it lacks the log's state member.
				foreign{alg.String() + "/sorted set", "", zset})
		}
		for _, tc := range cases {
			key := uniqueKey(t, tc.name)
			rkey := "{" + key + "}"
			cfg := cfg
			if alg, _, ok := strings.Cut(tc.name, "/"); ok {
				cfg.Algorithm = algorithmNamed(alg)
			}
			switch {
			case strings.HasSuffix(tc.name, "hash"):
				c.HSet(ctx, rkey, "f", "v")
			case strings.HasSuffix(tc.name, "sorted set"):
				c.ZAdd(ctx, rkey, redis.Z{Score: 1, Member: "m"})
			default:
				c.Set(ctx, rkey, tc.value, 0)
			}
			_, err := b.Do(ctx, key, cfg, take)
			if !errors.Is(err, ratelimit.ErrKeyRejected) || errors.Is(err, ratelimit.ErrBackendUnavailable) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Do on a key holding a %s: %v; want ErrKeyRejected, not ErrBackendUnavailable, saying %q", tc.name, err, tc.want)
			}
			if kind := c.Type(ctx, rkey).Val(); tc.value != "" && c.Get(ctx, rkey).Val() != tc.value || tc.value == "" && kind != "hash" && kind != "zset" {
				t.Errorf("the %s value became a %s %q; want it left alone", tc.name, kind, c.Get(ctx, rkey).Val())
			}
		}
	})
}

// algorithmNamed returns the algorithm whose String is name.
func algorithmNamed(name string) ratelimit.Algorithm {
	for alg := range ratelimit.Algorithm(numAlgorithms) {
		if alg.String() == name {
			return alg
		}
	}
	panic("redistest: no algorithm " + name)
}
