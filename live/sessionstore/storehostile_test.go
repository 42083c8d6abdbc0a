package sessionstore

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lm-warden/warden/live/redistest"
)

// The session store against a Redis that misbehaves (issue 46, item 7):
// replies that announce more than they should, keys of the wrong type,
// other proxies' records that lie or swamp, round trips near the timeout.

// noLeaks fails t if goroutines started during it are still running once
// its cleanups (registered later, so run earlier) are done.
func noLeaks(t *testing.T) {
	t.Helper()
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

// serveTCP accepts connections on 127.0.0.1 and runs handle on each,
// until the test ends: then it closes the listener and every connection,
// and waits for the handlers.
func serveTCP(t *testing.T, handle func(c net.Conn)) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { handle(c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln
}

// startRESPServer is a hand-written RESP server on 127.0.0.1 (a fault
// injector): it reads commands and writes what answer returns for each,
// raw; answer returning nil closes the connection. It returns its URL.
func startRESPServer(t *testing.T, answer func(cmd []string) []byte) string {
	ln := serveTCP(t, func(c net.Conn) {
		defer c.Close()
		rd := bufio.NewReader(c)
		for {
			cmd, err := readRESPCommand(rd)
			if err != nil {
				return
			}
			out := answer(cmd)
			if out == nil {
				return
			}
			if _, err := c.Write(out); err != nil {
				return
			}
		}
	})
	return "redis://" + ln.Addr().String() + "/0"
}

// readRESPCommand reads one command: an array of bulk strings.
func readRESPCommand(rd *bufio.Reader) ([]string, error) {
	line, err := rd.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(line, "*") {
		return nil, fmt.Errorf("not a command: %q", line)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil {
		return nil, err
	}
	cmd := make([]string, n)
	for i := range cmd {
		h, err := rd.ReadString('\n')
		if err != nil {
			return nil, err
		}
		size, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(h, "$")))
		if err != nil {
			return nil, err
		}
		b := make([]byte, size+2)
		if _, err := io.ReadFull(rd, b); err != nil {
			return nil, err
		}
		cmd[i] = string(b[:size])
	}
	return cmd, nil
}

// TestStoreReplyBounded: a store whose answer to a claim announces more
// than a reply may hold fails that claim, as a broken exchange does,
// having allocated a bounded amount, whatever it announces. Before (no
// bound: go-redis allocates what a header announces): the 50-million
// element array header allocated 800 MB (the proxy went to 3.8 GB in
// issue 46), the gigabyte string 1 GB, the nested arrays 320 MB, the
// status line without its end 100 MB.
func TestStoreReplyBounded(t *testing.T) {
	noLeaks(t)
	for _, tc := range []struct {
		name, reply string
	}{
		{"array header of 50 million", "*50000000\r\n"},
		{"bulk string of a gigabyte", "$1000000000\r\n"},
		{"RESP3 map of 10 million", "%10000000\r\n"},
		{"20 nested arrays of a million", strings.Repeat("*1000000\r\n", 20)},
		{"status line of 32 MiB without its end", "+" + strings.Repeat("a", 32<<20)},
		{"not RESP", "HTTP/1.1 200 OK\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reply := []byte(tc.reply)
			url := startRESPServer(t, func(cmd []string) []byte {
				switch strings.ToUpper(cmd[0]) {
				case "EVALSHA", "EVAL":
					return reply
				case "HELLO":
					return []byte("-ERR unknown command 'HELLO'\r\n")
				}
				return []byte("+OK\r\n")
			})
			s, err := OpenRedis(url, "", 2*time.Second, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var ms runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&ms)
			before := ms.TotalAlloc
			_, _, cerr := s.Claim(context.Background(), "m", "s", "r0", time.Hour)
			runtime.ReadMemStats(&ms)
			got := ms.TotalAlloc - before
			if cerr == nil {
				t.Fatal("the claim succeeded")
			}
			t.Logf("allocated %d KiB: %v", got>>10, cerr)
			if got > 16<<20 {
				t.Errorf("the claim allocated %d MiB, want at most 16 (err %v)", got>>20, cerr)
			}
			if !strings.Contains(cerr.Error(), "session store:") {
				t.Errorf("err %q does not say the store's reply was refused", cerr)
			}
		})
	}
}

// TestStoreSkipsKeysOfTheWrongType: a key of the wrong type or size,
// wherever the store reads one, is skipped and counted (bad_keys,
// bad_key), and neither the sync nor the claim fails. Before: each such
// key failed every sync of every proxy with WRONGTYPE (the store down on
// both until it was deleted).
func TestStoreSkipsKeysOfTheWrongType(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		plant func(c *redis.Client, now time.Time) error
		bad   string // the key bad_key names
	}{
		{"held set a string", func(c *redis.Client, _ time.Time) error {
			return c.Set(ctx, HeldKey("m", "r0"), "x", 0).Err()
		}, HeldKey("m", "r0")},
		{"proxies set a list", func(c *redis.Client, _ time.Time) error {
			return c.RPush(ctx, ProxiesKey, "x").Err()
		}, ProxiesKey},
		{"another proxy's counts a string", func(c *redis.Client, now time.Time) error {
			if err := c.ZAdd(ctx, ProxiesKey, redis.Z{Score: float64(now.Add(Lease).UnixMilli()), Member: "liar"}).Err(); err != nil {
				return err
			}
			return c.Set(ctx, Prefix+"load:liar", "x", 0).Err()
		}, Prefix + "load:liar"},
		{"another proxy's counts too many", func(c *redis.Client, now time.Time) error {
			if err := c.ZAdd(ctx, ProxiesKey, redis.Z{Score: float64(now.Add(Lease).UnixMilli()), Member: "wide"}).Err(); err != nil {
				return err
			}
			fields := make([]any, 0, 2*(maxPeerFields+1))
			for i := range maxPeerFields + 1 {
				fields = append(fields, LoadField("m", "r"+strconv.Itoa(i)), 1)
			}
			return c.HSet(ctx, Prefix+"load:wide", fields...).Err()
		}, Prefix + "load:wide"},
		{"a home a hash", func(c *redis.Client, _ time.Time) error {
			return c.HSet(ctx, homeKey("m", "s-bad"), "f", "v").Err()
		}, homeKey("m", "s-bad")},
		{"a home too long", func(c *redis.Client, _ time.Time) error {
			return c.Set(ctx, homeKey("m", "s-bad"), strings.Repeat("r", maxStoreName+1), 0).Err()
		}, homeKey("m", "s-bad")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := redistest.Start(t)
			c := rs.Client(t)
			a, b := testStore(t, rs), testStore(t, rs)
			if err := tc.plant(c, time.Now()); err != nil {
				t.Fatal(err)
			}
			loads := []Load{{Model: "m", Replica: "r0", InFlight: 2, TTL: time.Hour, Window: time.Minute}}
			a.Touch("m", "s-touched", "r0", time.Now())
			failed := 0
			for range 2 {
				for _, s := range []*Redis{a, b} {
					if err := s.sync(ctx, loads); err != nil {
						failed++
						t.Errorf("sync: %v", err)
					}
				}
			}
			for _, s := range []*Redis{a, b} {
				for _, session := range []string{"s-bad", "s-good"} {
					if _, _, err := s.Claim(ctx, "m", session, "r0", time.Hour); err != nil {
						t.Errorf("claim %s: %v", session, err)
					}
				}
			}
			for i, s := range []*Redis{a, b} {
				st := s.State()
				if !st.Up || st.BadKeysTotal == 0 || !strings.HasPrefix(st.BadKey, tc.bad+" is ") {
					t.Errorf("proxy %d: up %v, bad keys %d, bad key %q; want up and %s named", i, st.Up, st.BadKeysTotal, st.BadKey, tc.bad)
				}
			}
			t.Logf("%d of 4 syncs failed; a: %+v", failed, a.State())
			// What the bad key does not touch still works: b sees a's count
			// (unless the proxies set is the bad key), a's touch is recorded.
			if tc.bad != ProxiesKey {
				if n, _, ok := b.Remote("m", "r0"); !ok || n != 2 {
					t.Errorf("b sees %d in flight from a (ok %v), want 2", n, ok)
				}
			}
			if h, existed, err := b.Claim(ctx, "m", "s-touched", "r9", time.Hour); err != nil || !existed || h != "r0" {
				t.Errorf("a's touch: home %q existed %v err %v, want r0 recorded", h, existed, err)
			}
		})
	}
}

// TestStoreTrustsOthersUpToTheCap: two records of other proxies claiming
// 2^63-1 requests in flight on a replica count as the cap each (this
// proxy's limits.max_in_flight), and counts that are no count are not
// trusted at all. Before: their sum overflowed to -2, the replica looked
// idle, and every new session went there (see
// TestSharedStoreLyingProxies).
func TestStoreTrustsOthersUpToTheCap(t *testing.T) {
	noLeaks(t)
	rs := redistest.Start(t)
	c := rs.Client(t)
	ctx := context.Background()
	now := time.Now()
	for _, liar := range []string{"liar-1", "liar-2", "liar-3"} {
		if err := c.ZAdd(ctx, ProxiesKey, redis.Z{Score: float64(now.Add(Lease).UnixMilli()), Member: liar}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	huge := strconv.FormatInt(math.MaxInt64, 10)
	for key, value := range map[string]string{"liar-1": huge, "liar-2": huge, "liar-3": "-5"} {
		if err := c.HSet(ctx, Prefix+"load:"+key, LoadField("m", "r0"), value, LoadField("m", "r1"), "x").Err(); err != nil {
			t.Fatal(err)
		}
	}
	s := testStore(t, rs)
	loads := []Load{
		{Model: "m", Replica: "r0", TTL: time.Hour, Window: time.Minute, Cap: 1000},
		{Model: "m", Replica: "r1", TTL: time.Hour, Window: time.Minute, Cap: 1000},
	}
	if err := s.sync(ctx, loads); err != nil {
		t.Fatal(err)
	}
	for replica, want := range map[string]int{"r0": 2000, "r1": 0} {
		if n, _, ok := s.Remote("m", replica); !ok || n != want {
			t.Errorf("%s: %d in flight from the others (ok %v), want %d", replica, n, ok, want)
		}
	}
	if st := s.State(); st.Capped != 6 || st.Proxies != 4 || st.Read != 3 {
		t.Errorf("capped %d, proxies %d, read %d; want 6 claims capped or not trusted, 4 proxies, 3 read", st.Capped, st.Proxies, st.Read)
	}
	if satAdd(math.MaxInt, 1) != math.MaxInt || satAdd(math.MaxInt-1, 1) != math.MaxInt || satAdd(2, 3) != 5 {
		t.Error("satAdd does not saturate")
	}
}

// TestStoreBoundsForeignLeases: 100,000 leases of other proxies cost one
// sync the counts of maxStorePeers of them, said in partial, with the
// total in proxies. Before: the sync read every one (100,000 HGETALL in one
// pipeline) and timed out at the default session_store_timeout.
func TestStoreBoundsForeignLeases(t *testing.T) {
	noLeaks(t)
	rs := redistest.Start(t)
	c := rs.Client(t)
	ctx := context.Background()
	now := time.Now()
	const leases = 100_000
	for from := 0; from < leases; from += 10_000 {
		zs := make([]redis.Z, 10_000)
		for i := range zs {
			zs[i] = redis.Z{Score: float64(now.Add(Lease).UnixMilli()), Member: fmt.Sprintf("flood-%06d", from+i)}
		}
		if err := c.ZAdd(ctx, ProxiesKey, zs...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// And one more a whole lease ahead of any proxy's: not read.
	if err := c.ZAdd(ctx, ProxiesKey, redis.Z{Score: float64(now.Add(time.Hour).UnixMilli()), Member: "ahead"}).Err(); err != nil {
		t.Fatal(err)
	}
	s := testStore(t, rs)
	s.now = func() time.Time { return now } // the leases live however long planting them took
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	loads := []Load{{Model: "m", Replica: "r0", TTL: time.Hour, Window: time.Minute}}
	if err := s.sync(ctx, loads); err != nil {
		t.Fatal(err)
	}
	calls := redisCalls(t, c)
	st := s.State()
	t.Logf("%d commands run by the store for one sync; status %+v", calls, st)
	if st.Proxies != leases+2 || st.Read != maxStorePeers || !strings.Contains(st.Partial, fmt.Sprintf("read %d of %d other proxies' counts", maxStorePeers, leases+1)) ||
		!strings.Contains(st.Partial, "not read: 1 leases") {
		t.Errorf("proxies %d, read %d, partial %q; want %d, %d and both said", st.Proxies, st.Read, st.Partial, leases+2, maxStorePeers)
	}
	if calls > 10*maxStorePeers {
		t.Errorf("one sync ran %d commands on the store, want at most %d", calls, 10*maxStorePeers)
	}
}

// redisCalls sums the calls of every command since CONFIG RESETSTAT,
// those scripts made included (INFO commandstats).
func redisCalls(t *testing.T, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for line := range strings.SplitSeq(info, "\n") {
		_, rest, ok := strings.Cut(line, ":calls=")
		if !ok || strings.HasPrefix(line, "cmdstat_info:") || strings.HasPrefix(line, "cmdstat_config") {
			continue
		}
		n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
		total += n
	}
	return total
}

// TestStoreBoundsTouchesPerSync: a backlog of touches (an outage's) is
// recorded maxTouchesPerSync a sync, the rest said in partial and kept.
func TestStoreBoundsTouchesPerSync(t *testing.T) {
	noLeaks(t)
	rs := redistest.Start(t)
	s := testStore(t, rs)
	ctx := context.Background()
	const n = 2*maxTouchesPerSync + 10
	for i := range n {
		s.Touch("m", "t"+strconv.Itoa(i), "r0", time.Now())
	}
	loads := []Load{{Model: "m", Replica: "r0", TTL: time.Hour, Window: time.Minute}}
	for i, left := range []int{n - maxTouchesPerSync, n - 2*maxTouchesPerSync, 0} {
		if err := s.sync(ctx, loads); err != nil {
			t.Fatal(err)
		}
		st := s.State()
		if st.Pending != left || (left > 0) != strings.Contains(st.Partial, fmt.Sprintf("%d touches wait for the next sync", left)) {
			t.Errorf("after sync %d: %d pending, partial %q; want %d said", i+1, st.Pending, st.Partial, left)
		}
	}
	if _, held, _ := s.Remote("m", "r0"); held != n {
		t.Errorf("%d conversations held on r0 after the backlog, want %d", held, n)
	}
}

// FuzzReplyGuard: any bytes, cut anywhere, are passed on or refused the
// same way (the scan carries its state across reads), never past what the
// budget allows to be announced.
func FuzzReplyGuard(f *testing.F) {
	for _, s := range []string{"+OK\r\n", "*2\r\n$3\r\nabc\r\n:1\r\n", "*50000000\r\n", "$-1\r\n*-1\r\n", "%1\r\n+a\r\n+b\r\n", "$5\r\nab", "*-2\r\n", "$1a\r\n", "?x"} {
		f.Add([]byte(s), uint16(3))
	}
	f.Fuzz(func(t *testing.T, data []byte, cut uint16) {
		const budget = 1 << 10
		whole := &replyGuard{budget: budget}
		werr := whole.scan(data)
		pieces := &replyGuard{budget: budget}
		var perr error
		for rest, step := data, max(int(cut)%17, 1); len(rest) > 0 && perr == nil; {
			k := min(step, len(rest))
			perr = pieces.scan(rest[:k])
			rest = rest[k:]
		}
		if (werr == nil) != (perr == nil) || whole.used != pieces.used {
			t.Fatalf("whole: %v (%d announced); in pieces of %d: %v (%d)", werr, whole.used, cut, perr, pieces.used)
		}
		if whole.used > budget {
			t.Fatalf("%d announced, past the budget %d", whole.used, budget)
		}
	})
}
