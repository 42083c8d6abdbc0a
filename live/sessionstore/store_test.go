package sessionstore

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lm-warden/warden/live/redistest"
)

// testStore opens a store on srv with a timeout generous enough for a
// loaded test machine (the default few milliseconds is for production).
func testStore(t *testing.T, srv *redistest.Server) *Redis {
	t.Helper()
	s, err := OpenRedis(srv.URL(0), "", 500*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestParseURL(t *testing.T) {
	t.Setenv("WARDEN_TEST_REDIS_PW", "from-env")
	for _, tc := range []struct {
		raw, env   string
		wantErr    string
		wantURL    string
		wantPass   string
		wantDB     int
		wantTLS    bool
		wantNoLeak string // must not appear in the error or the redacted URL
	}{
		{raw: "redis://127.0.0.1:6379/2", wantURL: "redis://127.0.0.1:6379/2", wantDB: 2},
		{raw: "rediss://:s3cret@cache.internal:6380/0", wantURL: "rediss://cache.internal:6380/0", wantPass: "s3cret", wantTLS: true, wantNoLeak: "s3cret"},
		{raw: "redis://127.0.0.1:6379/0", env: "WARDEN_TEST_REDIS_PW", wantURL: "redis://127.0.0.1:6379/0", wantPass: "from-env"},
		{raw: "redis://127.0.0.1:6379/0", env: "WARDEN_TEST_REDIS_UNSET", wantErr: "WARDEN_TEST_REDIS_UNSET is not set"},
		{raw: "http://127.0.0.1:6379", wantErr: `scheme "http"`},
		{raw: "redis:///0", wantErr: "no host"},
		{raw: "redis://:p4ss@127.0.0.1:6379/notanumber", wantErr: "session_store", wantNoLeak: "p4ss"},
		{raw: "redis://:p4ss@127.0.0.1:bad port/0", wantErr: "session_store", wantNoLeak: "p4ss"},
	} {
		t.Run(tc.raw+tc.env, func(t *testing.T) {
			opt, red, err := ParseURL(tc.raw, tc.env)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				if tc.wantNoLeak != "" && strings.Contains(err.Error(), tc.wantNoLeak) {
					t.Fatalf("error %q leaks the password", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if red != tc.wantURL || opt.Password != tc.wantPass || opt.DB != tc.wantDB || (opt.TLSConfig != nil) != tc.wantTLS {
				t.Fatalf("got url %q password %q db %d tls %v", red, opt.Password, opt.DB, opt.TLSConfig != nil)
			}
		})
	}
}

// Proxies placing one new session at once agree on its home: the first
// claim wins and every other sees it.
func TestStoreClaimIsAtomic(t *testing.T) {
	srv := redistest.Start(t)
	a, b := testStore(t, srv), testStore(t, srv)
	for n := range 20 {
		session := fmt.Sprintf("s%02d", n)
		var wg sync.WaitGroup
		homes := make([]string, 8)
		fresh := make([]bool, 8)
		for i := range 8 {
			st := a
			if i%2 == 1 {
				st = b
			}
			wg.Go(func() {
				h, existed, err := st.Claim(context.Background(), "m", session, fmt.Sprintf("r%d", i), time.Minute)
				if err != nil {
					t.Error(err)
				}
				homes[i], fresh[i] = h, !existed
			})
		}
		wg.Wait()
		won := 0
		for i := range homes {
			if homes[i] != homes[0] {
				t.Fatalf("session %s: homes %v disagree", session, homes)
			}
			if fresh[i] {
				won++
			}
		}
		if won != 1 {
			t.Fatalf("session %s: %d claims recorded a home, want 1", session, won)
		}
	}
}

// The counts each proxy publishes reach the others (not itself), the held
// conversations are counted over every proxy's touches, and a dead proxy's
// counts stop counting once its lease ends.
func TestStoreSharesLoadUnderALease(t *testing.T) {
	srv := redistest.Start(t)
	a, b := testStore(t, srv), testStore(t, srv)
	ctx := context.Background()
	now := time.Now()
	a.now = func() time.Time { return now }
	b.now = func() time.Time { return now }
	loads := func(inFlight int) []Load {
		return []Load{
			{Model: "m", Replica: "r0", InFlight: inFlight, TTL: time.Hour, Window: time.Minute},
			{Model: "m", Replica: "r1", TTL: time.Hour, Window: time.Minute},
		}
	}
	a.Touch("m", "s1", "r0", now)
	a.Touch("m", "s2", "r0", now.Add(-2*time.Minute)) // outside the active window: homed, not held
	b.Touch("m", "s3", "r0", now)
	b.Touch("m", "s4", "r1", now)
	if err := a.sync(ctx, loads(3)); err != nil {
		t.Fatal(err)
	}
	if err := b.sync(ctx, loads(5)); err != nil {
		t.Fatal(err)
	}
	if err := a.sync(ctx, loads(3)); err != nil { // a now sees b's counts and touches
		t.Fatal(err)
	}
	for _, tc := range []struct {
		st           *Redis
		replica      string
		inFlight, hd int
	}{
		{a, "r0", 5, 2}, {a, "r1", 0, 1}, {b, "r0", 3, 2}, {b, "r1", 0, 1},
	} {
		f, h, ok := tc.st.Remote("m", tc.replica)
		if !ok || f != tc.inFlight || h != tc.hd {
			t.Errorf("%s: Remote(%s) = %d in flight, %d held, %v; want %d, %d", tc.st.id, tc.replica, f, h, ok, tc.inFlight, tc.hd)
		}
	}
	if st := a.State(); st.Proxies != 2 || !st.Up || st.Pending != 0 {
		t.Errorf("State = %+v, want 2 proxies, up, nothing pending", st)
	}
	for _, s := range []string{"s1", "s2", "s3"} {
		if h, existed, err := b.Claim(ctx, "m", s, "r1", time.Hour); err != nil || !existed || h != "r0" {
			t.Errorf("claim %s = %q existed %v err %v; want the touched home r0", s, h, existed, err)
		}
	}
	// a dies without leaving: after its lease its 3 requests stop counting.
	now = now.Add(Lease + time.Second)
	if err := b.sync(ctx, loads(5)); err != nil {
		t.Fatal(err)
	}
	if f, _, _ := b.Remote("m", "r0"); f != 0 {
		t.Errorf("after a's lease: b sees %d in flight from others, want 0", f)
	}
	if st := b.State(); st.Proxies != 1 {
		t.Errorf("after a's lease: %d proxies, want 1", st.Proxies)
	}
}

// A store that goes away marks itself down, keeps the touches (bounded) and
// records them when it comes back, without overwriting a home another
// proxy recorded meanwhile.
func TestStoreDownAndBack(t *testing.T) {
	srv := redistest.Start(t)
	s := testStore(t, srv)
	clock := time.Now()
	s.now = func() time.Time { return clock }
	ctx := context.Background()
	loads := []Load{{Model: "m", Replica: "r0", TTL: time.Hour, Window: time.Minute}}
	if err := s.sync(ctx, loads); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	gap := storeFallFor / (storeFall - 1)
	for i := range storeFall { // down at the storeFall-th failure in a row, storeFallFor after the first
		if _, _, err := s.Claim(ctx, "m", "x", "r0", time.Hour); err == nil {
			t.Fatal("claim with the store stopped: no error")
		}
		if up, want := s.Up(), i < storeFall-1; up != want {
			t.Fatalf("after %d failed claims: up %v, want %v", i+1, up, want)
		}
		clock = clock.Add(gap)
	}
	s.Touch("m", "placed-while-down", "r0", time.Now())
	s.Touch("m", "raced", "r0", time.Now())
	if err := s.sync(ctx, loads); err == nil {
		t.Fatal("sync with the store stopped: no error")
	}
	if st := s.State(); st.Pending != 2 || st.LastError == "" {
		t.Fatalf("State = %+v, want 2 pending touches and the error", st)
	}
	srv.Restart()
	other := testStore(t, srv)
	if _, _, err := other.Claim(ctx, "m", "raced", "r9", time.Hour); err != nil { // another proxy got there first
		t.Fatal(err)
	}
	for i := range storeRise { // up at the storeRise-th good sync in a row, storeRiseFor after the first
		if err := s.sync(ctx, loads); err != nil {
			t.Fatal(err)
		}
		if up, want := s.Up(), i == storeRise-1; up != want {
			t.Fatalf("after %d good syncs: up %v, want %v", i+1, up, want)
		}
		clock = clock.Add(storeRiseFor / (storeRise - 1))
	}
	for session, want := range map[string]string{"placed-while-down": "r0", "raced": "r9"} {
		if h, existed, err := other.Claim(ctx, "m", session, "r5", time.Hour); err != nil || !existed || h != want {
			t.Errorf("%s: home %q existed %v err %v, want %q", session, h, existed, err, want)
		}
	}
}

func TestStorePendingIsBounded(t *testing.T) {
	s, err := OpenRedis("redis://127.0.0.1:1/0", "", time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Now()
	for i := range maxPendingTouches + 10 {
		s.Touch("m", fmt.Sprint(i), "r0", now)
	}
	s.Touch("m", "0", "r1", now) // a known session's touch replaces its earlier one
	if st := s.State(); st.Pending != maxPendingTouches || st.Dropped != 10 {
		t.Fatalf("pending %d dropped %d, want %d and 10", st.Pending, st.Dropped, maxPendingTouches)
	}
}

// FuzzParseURL: any session_store value is accepted or refused with an
// error, never a panic, and a password in it never reaches the error or
// the redacted URL shown in /api/status.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{"redis://127.0.0.1:6379/0", "rediss://:pw@h:1/2", "redis://u:pw@h/x", "redis://:pw@[::1", "http://h", "redis://:pw@h:1/0?dial_timeout=x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		const secret = "Zq9secretZq9"
		withPw := strings.Replace(raw, "pw", secret, 1)
		_, red, err := ParseURL(withPw, "")
		u, perr := url.Parse(withPw)
		pw, hasPw := "", false
		if perr == nil {
			pw, hasPw = u.User.Password()
		}
		leaks := func(s string) bool { return hasPw && strings.Contains(pw, secret) && strings.Contains(s, secret) }
		if err != nil {
			if leaks(err.Error()) {
				t.Fatalf("error %q shows the password", err)
			}
			return
		}
		if leaks(red) {
			t.Fatalf("redacted URL %q shows the password", red)
		}
	})
}
