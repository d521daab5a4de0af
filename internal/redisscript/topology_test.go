package redisscript_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

// online and failed are ShardNodes of a cluster without TLS, as Redis
// 7.0 lists them: at 127.0.0.1, announcing their IP.
func online(role string, port int64) redisscript.ShardNode {
	return redisscript.ShardNode{Endpoint: "127.0.0.1", IP: "127.0.0.1", Port: port, Role: role, Health: "online"}
}

func failed(role string, port int64) redisscript.ShardNode {
	n := online(role, port)
	n.Health = "fail"
	return n
}

// slots returns the ranges of the first and last slots given in pairs.
func slots(bounds ...int) []ratelimit.SlotRange {
	var ranges []ratelimit.SlotRange
	for i := 0; i+1 < len(bounds); i += 2 {
		ranges = append(ranges, ratelimit.SlotRange{First: bounds[i], Last: bounds[i+1]})
	}
	return ranges
}

func TestMasters(t *testing.T) {
	for _, tc := range []struct {
		name    string
		shards  []redisscript.Shard
		want    []ratelimit.Master
		wantErr string
	}{
		{name: "no shards"},
		{
			name: "sorted by address, ranges in order",
			shards: []redisscript.Shard{
				{Slots: [][2]int64{{10923, 16383}}, Nodes: []redisscript.ShardNode{online("master", 7003)}},
				{Slots: [][2]int64{{100, 5460}, {0, 10}}, Nodes: []redisscript.ShardNode{online("master", 7001)}},
				{Slots: [][2]int64{{5461, 10922}}, Nodes: []redisscript.ShardNode{online("master", 7002)}},
			},
			want: []ratelimit.Master{
				{Addr: "127.0.0.1:7001", Slots: slots(0, 10, 100, 5460)},
				{Addr: "127.0.0.1:7002", Slots: slots(5461, 10922)},
				{Addr: "127.0.0.1:7003", Slots: slots(10923, 16383)},
			},
		},
		{
			name: "shards without slots skipped",
			shards: []redisscript.Shard{
				{Nodes: []redisscript.ShardNode{online("master", 7009), online("replica", 7010)}},
				{Slots: [][2]int64{}, Nodes: []redisscript.ShardNode{failed("master", 7008)}},
				{Slots: [][2]int64{{0, 16383}}, Nodes: []redisscript.ShardNode{online("replica", 7002), online("master", 7001)}},
				{},
			},
			want: []ratelimit.Master{{Addr: "127.0.0.1:7001", Slots: slots(0, 16383)}},
		},
		{
			name:   "one slot",
			shards: []redisscript.Shard{{Slots: [][2]int64{{16383, 16383}}, Nodes: []redisscript.ShardNode{online("master", 7001)}}},
			want:   []ratelimit.Master{{Addr: "127.0.0.1:7001", Slots: slots(16383, 16383)}},
		},
		{
			name:    "slots but no master",
			shards:  []redisscript.Shard{{Slots: [][2]int64{{0, 16383}}, Nodes: []redisscript.ShardNode{online("replica", 7002)}}},
			wantErr: "has no master",
		},
		{
			name:    "slots and no node",
			shards:  []redisscript.Shard{{Slots: [][2]int64{{0, 16383}}}},
			wantErr: "has no master",
		},
		{
			name:    "negative slot",
			shards:  []redisscript.Shard{{Slots: [][2]int64{{-1, 10}}, Nodes: []redisscript.ShardNode{online("master", 7001)}}},
			wantErr: "slot range -1-10 is out of bounds",
		},
		{
			name:    "slot past the last",
			shards:  []redisscript.Shard{{Slots: [][2]int64{{0, 16384}}, Nodes: []redisscript.ShardNode{online("master", 7001)}}},
			wantErr: "slot range 0-16384 is out of bounds",
		},
		{
			name:    "range backwards",
			shards:  []redisscript.Shard{{Slots: [][2]int64{{11, 10}}, Nodes: []redisscript.ShardNode{online("master", 7001)}}},
			wantErr: "slot range 11-10 is out of bounds",
		},
		{
			name: "online master after a failed one",
			shards: []redisscript.Shard{{Slots: [][2]int64{{0, 16383}}, Nodes: []redisscript.ShardNode{
				failed("master", 7001), online("master", 7002), online("replica", 7003),
			}}},
			want: []ratelimit.Master{{Addr: "127.0.0.1:7002", Slots: slots(0, 16383)}},
		},
		{
			name: "online master before a failed one",
			shards: []redisscript.Shard{{Slots: [][2]int64{{0, 16383}}, Nodes: []redisscript.ShardNode{
				online("replica", 7003), online("master", 7002), failed("master", 7001),
			}}},
			want: []ratelimit.Master{{Addr: "127.0.0.1:7002", Slots: slots(0, 16383)}},
		},
		{
			name:   "only a failed master",
			shards: []redisscript.Shard{{Slots: [][2]int64{{0, 16383}}, Nodes: []redisscript.ShardNode{failed("master", 7001)}}},
			want:   []ratelimit.Master{{Addr: "127.0.0.1:7001", Slots: slots(0, 16383)}},
		},
		{
			name: "endpoints: hostname, none, unknown, IPv6",
			shards: []redisscript.Shard{
				{Slots: [][2]int64{{0, 1}}, Nodes: []redisscript.ShardNode{{Endpoint: "redis-1.example", IP: "10.0.0.1", Port: 6379, Role: "master", Health: "online"}}},
				{Slots: [][2]int64{{2, 3}}, Nodes: []redisscript.ShardNode{{Endpoint: "", IP: "10.0.0.2", Port: 6379, Role: "master", Health: "online"}}},
				{Slots: [][2]int64{{4, 5}}, Nodes: []redisscript.ShardNode{{Endpoint: "?", IP: "10.0.0.3", Port: 6379, Role: "master", Health: "online"}}},
				{Slots: [][2]int64{{6, 7}}, Nodes: []redisscript.ShardNode{{Endpoint: "::1", IP: "::1", Port: 6379, Role: "master", Health: "online"}}},
			},
			want: []ratelimit.Master{
				{Addr: "10.0.0.2:6379", Slots: slots(2, 3)},
				{Addr: "10.0.0.3:6379", Slots: slots(4, 5)},
				{Addr: "[::1]:6379", Slots: slots(6, 7)},
				{Addr: "redis-1.example:6379", Slots: slots(0, 1)},
			},
		},
		{
			name: "TLS port when there is no plain one",
			shards: []redisscript.Shard{
				{Slots: [][2]int64{{0, 1}}, Nodes: []redisscript.ShardNode{{Endpoint: "10.0.0.1", IP: "10.0.0.1", TLSPort: 6380, Role: "master", Health: "online"}}},
				{Slots: [][2]int64{{2, 3}}, Nodes: []redisscript.ShardNode{{Endpoint: "10.0.0.2", IP: "10.0.0.2", Port: 6379, TLSPort: 6380, Role: "master", Health: "online"}}},
			},
			want: []ratelimit.Master{
				{Addr: "10.0.0.1:6380", Slots: slots(0, 1)},
				{Addr: "10.0.0.2:6379", Slots: slots(2, 3)},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := redisscript.Masters(tc.shards)
			if tc.wantErr != "" {
				if got != nil || err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Masters = %+v, %v; want an error saying %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || len(got) != len(tc.want) || len(got) > 0 && !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Masters = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// A store answers a Topology's fetches as the test says: each fetch waits
// in calls until the test takes it, then for the test's answer or the end
// of its context. Every channel is made in the synctest bubble, so a fetch
// waiting is durably blocked and synctest.Wait sees it.
type store struct {
	calls chan fetch
}

// A fetch is one call of the fetch function, waiting for its answer.
type fetch struct {
	ctx    context.Context
	answer chan<- answer
}

type answer struct {
	masters []ratelimit.Master
	err     error
}

func newStore() *store { return &store{calls: make(chan fetch)} }

func (s *store) fetch(ctx context.Context) ([]ratelimit.Master, error) {
	a := make(chan answer)
	s.calls <- fetch{ctx, a}
	select {
	case r := <-a:
		return r.masters, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// next returns the fetch that is waiting once every goroutine of the
// bubble has blocked, and fails the test if none is.
func (s *store) next(t *testing.T) fetch {
	t.Helper()
	synctest.Wait()
	select {
	case f := <-s.calls:
		return f
	default:
		t.Fatal("no fetch started; want one")
		return fetch{}
	}
}

// none fails the test if a fetch is waiting once every goroutine of the
// bubble has blocked.
func (s *store) none(t *testing.T) {
	t.Helper()
	synctest.Wait()
	select {
	case f := <-s.calls:
		f.answer <- answer{err: errors.New("unexpected fetch")}
		t.Fatal("a fetch started; want none")
	default:
	}
}

// reply answers f and waits until the load it was for has ended.
func (f fetch) reply(masters []ratelimit.Master, err error) {
	f.answer <- answer{masters, err}
	synctest.Wait()
}

var (
	threeMasters = []ratelimit.Master{
		{Addr: "127.0.0.1:7001", Slots: slots(0, 5460)},
		{Addr: "127.0.0.1:7002", Slots: slots(5461, 10922)},
		{Addr: "127.0.0.1:7003", Slots: slots(10923, 16000, 16002, 16383)},
	}
	// failedOver is threeMasters once 7004 has taken over from 7002.
	failedOver = []ratelimit.Master{threeMasters[0], threeMasters[2], {Addr: "127.0.0.1:7004", Slots: slots(5461, 10922)}}
)

// checkNodes checks Node for slots around every boundary of masters,
// and out of range.
func checkNodes(t *testing.T, top *redisscript.Topology, masters []ratelimit.Master) {
	t.Helper()
	for _, slot := range []int{-1, 0, 1, 5460, 5461, 10922, 10923, 16000, 16001, 16002, 16383, 16384} {
		want := ""
		if i := ratelimit.Owner(masters, slot); i >= 0 {
			want = masters[i].Addr
		}
		if got := top.Node(slot); got != want {
			t.Errorf("Node(%d) = %q; want %q", slot, got, want)
		}
	}
}

// TestTopologyNode follows a Topology that only Node loads: nothing until
// the first load ends, never two loads at once, a reload a second after
// the last load ended (whether it failed or not), and a failed load
// keeping the last map.
func TestTopologyNode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newStore()
		top := redisscript.NewTopology(s.fetch)
		if got := top.Node(0); got != "" {
			t.Fatalf("Node(0) before any load = %q; want \"\"", got)
		}
		first := s.next(t)
		if deadline, ok := first.ctx.Deadline(); !ok || time.Until(deadline) != 2*time.Second {
			t.Errorf("a load's context has deadline %v (set: %v); want 2s from now", time.Until(deadline), ok)
		}

		// Past the refresh interval, but not the load's timeout.
		time.Sleep(1500 * time.Millisecond)
		for slot := range 100 {
			if got := top.Node(slot); got != "" {
				t.Fatalf("Node(%d) while the first load runs = %q; want \"\"", slot, got)
			}
		}
		s.none(t)

		first.reply(threeMasters, nil)
		checkNodes(t, top, threeMasters)
		time.Sleep(999 * time.Millisecond)
		top.Node(0)
		s.none(t)

		time.Sleep(time.Millisecond)
		top.Node(0)
		s.next(t).reply(nil, errors.New("connection refused"))
		checkNodes(t, top, threeMasters)
		s.none(t)

		time.Sleep(999 * time.Millisecond)
		top.Node(0)
		s.none(t)
		time.Sleep(time.Millisecond)
		checkNodes(t, top, threeMasters) // starts the third load
		s.next(t).reply(failedOver, nil)
		checkNodes(t, top, failedOver)
		s.none(t)
	})
}

// TestTopologyConcurrentNode: of many goroutines calling Node at once
// while the map is due, one starts a load.
func TestTopologyConcurrentNode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newStore()
		top := redisscript.NewTopology(s.fetch)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for slot := range 1000 {
					top.Node(slot)
				}
			})
		}
		wg.Wait()
		s.next(t).reply(threeMasters, nil)
		s.none(t)
		checkNodes(t, top, threeMasters)
	})
}

// TestTopologyLoadTimeout: a fetch that does not return is given up after
// two seconds; the map stays as it was, and the next load starts a second
// later.
func TestTopologyLoadTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newStore()
		top := redisscript.NewTopology(s.fetch)
		top.Node(0)
		s.next(t) // never answered
		time.Sleep(2 * time.Second)
		synctest.Wait()
		top.Node(0)
		s.none(t)
		time.Sleep(time.Second)
		if got := top.Node(0); got != "" {
			t.Errorf("Node(0) after a load timed out = %q; want \"\"", got)
		}
		s.next(t).reply(threeMasters, nil)
		checkNodes(t, top, threeMasters)
	})
}

// TestTopologyMasters: Masters returns what fetch does and keeps it as the
// map, which Node then reads without loading it again for a second; a
// failed Masters returns fetch's error and keeps the last map, and leaves
// the next Node to load it.
func TestTopologyMasters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newStore()
		top := redisscript.NewTopology(s.fetch)
		masters := func(reply []ratelimit.Master, err error) ([]ratelimit.Master, error) {
			type result struct {
				masters []ratelimit.Master
				err     error
			}
			done := make(chan result)
			go func() {
				m, err := top.Masters(context.Background())
				done <- result{m, err}
			}()
			s.next(t).answer <- answer{reply, err}
			r := <-done
			return r.masters, r.err
		}

		failure := errors.New("CLUSTERDOWN")
		if got, err := masters(nil, failure); got != nil || !errors.Is(err, failure) {
			t.Fatalf("Masters with fetch failing = %+v, %v; want fetch's error", got, err)
		}
		checkNodes(t, top, nil) // starts a load: a failed Masters does not postpone it
		s.next(t).reply(nil, failure)

		time.Sleep(time.Second)
		got, err := masters(threeMasters, nil)
		if err != nil || !reflect.DeepEqual(got, threeMasters) {
			t.Fatalf("Masters = %+v, %v; want %+v", got, err, threeMasters)
		}
		checkNodes(t, top, threeMasters)
		s.none(t)

		if got, err := masters(nil, failure); got != nil || !errors.Is(err, failure) {
			t.Fatalf("Masters with fetch failing = %+v, %v; want fetch's error", got, err)
		}
		checkNodes(t, top, threeMasters)
		s.none(t)

		time.Sleep(time.Second)
		checkNodes(t, top, threeMasters)
		s.next(t).reply(failedOver, nil)
		checkNodes(t, top, failedOver)
	})
}

// TestClusterTopology: a load through ClusterTopology hands the reply its
// fetch returned to its parse, and reads the masters from the shards; a
// failed fetch is a store error, and a reply that does not parse, or whose
// shards name no master for their slots, wraps ErrBackendUnavailable. A
// Backend without a Topology (a client that is not a cluster's) locates
// no node and reports Masters as unsupported, saying why.
func TestClusterTopology(t *testing.T) {
	ctx := context.Background()
	shards := []redisscript.Shard{
		{Slots: [][2]int64{{0, 8191}}, Nodes: []redisscript.ShardNode{online("master", 7000), online("replica", 7003)}},
		{Slots: [][2]int64{{8192, 16383}}, Nodes: []redisscript.ShardNode{online("master", 7001)}},
	}
	noMaster := []redisscript.Shard{{Slots: [][2]int64{{0, 16383}}, Nodes: []redisscript.ShardNode{online("replica", 7003)}}}
	refused, garbled := errors.New("connection refused"), errors.New("not a map")
	for _, c := range []struct {
		name    string
		fetch   error // the client's error
		parse   error // the decoding's error
		shards  []redisscript.Shard
		want    []string // the masters' addresses
		wantErr error
	}{
		{name: "masters", shards: shards, want: []string{"127.0.0.1:7000", "127.0.0.1:7001"}},
		{name: "fetch fails", fetch: refused, wantErr: refused},
		{name: "reply does not parse", parse: garbled, wantErr: garbled},
		{name: "no master", shards: noMaster, wantErr: ratelimit.ErrBackendUnavailable},
	} {
		t.Run(c.name, func(t *testing.T) {
			var parsed string
			top := redisscript.ClusterTopology("sluice/test", func(context.Context) (string, error) {
				return "reply", c.fetch
			}, func(reply string) ([]redisscript.Shard, error) {
				parsed = reply
				return c.shards, c.parse
			})
			masters, err := top.Masters(ctx)
			if c.wantErr != nil {
				if !errors.Is(err, c.wantErr) || !errors.Is(err, ratelimit.ErrBackendUnavailable) || !strings.Contains(err.Error(), "sluice/test") {
					t.Fatalf("Masters: %v; want an error naming sluice/test, wrapping %v and ErrBackendUnavailable", err, c.wantErr)
				}
				return
			}
			if err != nil || parsed != "reply" {
				t.Fatalf("Masters: %v, parse given %q; want no error, the fetched reply parsed", err, parsed)
			}
			var addrs []string
			for _, m := range masters {
				addrs = append(addrs, m.Addr)
			}
			if !reflect.DeepEqual(addrs, c.want) {
				t.Fatalf("masters %v; want %v", addrs, c.want)
			}
		})
	}

	b := redisscript.Backend{Name: "sluice/test"}
	if got := b.Node("k"); got != "" {
		t.Errorf("Node without a Topology = %q; want \"\"", got)
	}
	_, err := b.Masters(ctx, "the client is a plain one")
	if !errors.Is(err, errors.ErrUnsupported) || err.Error() != "sluice/test: Masters: the client is a plain one: unsupported operation" {
		t.Errorf("Masters without a Topology: %v; want ErrUnsupported, saying why", err)
	}
}
