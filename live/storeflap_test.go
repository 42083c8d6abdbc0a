package live

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lm-warden/warden/live/redistest"
	"github.com/lm-warden/warden/placement"
)

// stallRelay is a TCP relay in front of a Redis server that can hold the
// server's answers (a hand-written fault injector: a store slow for an
// exchange, as on a loaded machine), until released.
type stallRelay struct {
	ln    net.Listener
	to    string
	stall atomic.Bool
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func startStallRelay(t *testing.T, to string) *stallRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &stallRelay{ln: ln, to: to}
	r.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			r.mu.Lock()
			r.conns = append(r.conns, c, up)
			r.mu.Unlock()
			r.wg.Go(func() { io.Copy(up, c); up.Close() })
			r.wg.Go(func() {
				defer c.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := up.Read(buf)
					for n > 0 && r.stall.Load() { // hold the answer
						time.Sleep(5 * time.Millisecond)
					}
					if n > 0 {
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		r.stall.Store(false)
		ln.Close()
		r.mu.Lock()
		for _, c := range r.conns {
			c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

// TestStoreSlowExchangeDoesNotFlap (issue 35, item 8): a store that is
// slow for one exchange (a claim on the request path, or a sync) stays up;
// it goes down at the storeFall-th failure in a row, and up again at the
// next good sync, as health checks do. Before: every slow exchange marked
// it down (14 up/down flips in 80 s at the 5 ms default on a loaded
// machine), sending new conversations to the rendezvous choice and back.
func TestStoreSlowExchangeDoesNotFlap(t *testing.T) {
	rs := redistest.Start(t)
	for _, tc := range []struct {
		name   string
		script string // per exchange: o = a good sync, s = a slow claim, S = a slow sync
		want   string // the store's state after each: U up, D down
	}{
		{"one slow claim", "oso", "UUU"},
		{"one slow sync", "oSo", "UUU"},
		{"two slow claims", "ossoo", "UUUUU"},
		{"three slow in a row", "osSsoo", "UUUDUU"},
		{"slow apart", "osososos", "UUUUUUUU"},
		{"slow before the first sync", "so", "DU"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			relay := startStallRelay(t, rs.Addr)
			s, err := openRedisStore("redis://"+relay.ln.Addr().String()+"/0", "", 500*time.Millisecond) // a stalled exchange fails at this; a good one never nears it
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			local := func() []replicaLoad {
				return []replicaLoad{{Model: "m", Replica: "r0", TTL: time.Hour, Window: time.Minute}}
			}
			was := "unknown"
			got := ""
			for i, step := range tc.script {
				relay.stall.Store(step != 'o')
				switch step {
				case 's':
					if _, _, err := s.Claim(ctx, "m", fmt.Sprint("x", i), "r0", time.Hour); err == nil {
						t.Fatalf("exchange %d: a stalled claim succeeded", i)
					}
				default:
					s.step(ctx, local, 0, &was)
				}
				relay.stall.Store(false)
				if s.Up() {
					got += "U"
				} else {
					got += "D"
				}
			}
			if got != tc.want {
				t.Errorf("script %s: got %s, want %s", tc.script, got, tc.want)
			}
		})
	}
}

// downStore is a session store that is down: every claim fails (the
// store as two proxies see it while Redis is unreachable).
type downStore struct{}

func (downStore) Claim(context.Context, string, string, string, time.Duration) (string, bool, error) {
	return "", false, errors.New("store down")
}
func (downStore) Touch(string, string, string, time.Time)         {}
func (downStore) Remote(string, string) (int, int, bool)          { return 0, 0, false }
func (downStore) Up() bool                                        { return false }
func (downStore) Down() bool                                      { return true }
func (downStore) State() StoreStatus                              { return StoreStatus{} }
func (downStore) Run(ctx context.Context, _ func() []replicaLoad) { <-ctx.Done() }
func (downStore) Close() error                                    { return nil }

// TestRendezvousByReplicaName (issue 35, item 7): with the store down, two
// proxies whose configurations list the same replicas in different orders
// still place every new conversation on the same replica, the one
// rendezvous hashing of its id and the replica's URL (and rank) gives.
// Before: the weight was the replica's index, and two such proxies split
// 40 of 40 new sessions. With a replica down, both still agree, elsewhere.
func TestRendezvousByReplicaName(t *testing.T) {
	urls := []string{"http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"}
	for _, tc := range []struct {
		name  string
		a, b  ModelCfg
		names func(ModelCfg) []string
	}{
		{"urls reversed", ModelCfg{Replicas: urls}, ModelCfg{Replicas: []string{urls[2], urls[1], urls[0]}}, nil},
		{"urls rotated", ModelCfg{Replicas: urls}, ModelCfg{Replicas: []string{urls[1], urls[2], urls[0]}}, nil},
		{"two replicas swapped", ModelCfg{Replicas: urls[:2]}, ModelCfg{Replicas: []string{urls[1], urls[0]}}, nil},
		// strategy hash hashes by Replica.Key (the name), not list position.
		{"hash: urls reversed", ModelCfg{Strategy: "hash", Replicas: urls}, ModelCfg{Strategy: "hash", Replicas: []string{urls[2], urls[1], urls[0]}}, nil},
		{"hash: urls rotated", ModelCfg{Strategy: "hash", Replicas: urls}, ModelCfg{Strategy: "hash", Replicas: []string{urls[1], urls[2], urls[0]}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			build := func(mc ModelCfg) *model {
				mc.Name, mc.SessionTTL, mc.ActiveWindow, mc.MaxSessions = "m", Duration(time.Hour), Duration(time.Minute), 1000
				mc.SpillThreshold = Spill{Auto: true}
				m, err := newModel(mc, http.DefaultClient, time.Second, time.Second)
				if err != nil {
					t.Fatal(err)
				}
				m.store = downStore{}
				return m
			}
			a, b := build(tc.a), build(tc.b)
			now := time.Now()
			place := func(m *model, session string) string {
				r := placement.Request{Session: session, Model: "m", Pinned: placement.NoPin}
				p, err := m.place(context.Background(), &r, now)
				if err != nil {
					t.Fatal(err)
				}
				p.rep.inFlight.Add(-1)
				return p.rep.name
			}
			split, used := 0, map[string]bool{}
			homes := map[string]string{}
			for i := range 40 {
				s := fmt.Sprintf("session-%02d", i)
				ha, hb := place(a, s), place(b, s)
				if ha != hb {
					split++
				}
				homes[s] = ha
				used[ha] = true
			}
			if split > 0 {
				t.Errorf("the two proxies placed %d of 40 new sessions apart", split)
			}
			if len(used) != len(tc.a.Replicas) {
				t.Errorf("new sessions on %d of %d replicas", len(used), len(tc.a.Replicas))
			}
			// The first replica goes down: both proxies agree on another.
			down := tc.a.Replicas[0]
			for _, m := range []*model{a, b} {
				for _, rep := range m.replicas {
					if rep.name == down {
						rep.server.last.Store(&ScrapeResult{Seq: 1, Healthy: false})
					}
				}
			}
			for i := range 40 {
				s := fmt.Sprintf("later-%02d", i) // new ones: the tables hold the first 40
				ha, hb := place(a, s), place(b, s)
				if ha != hb || ha == down {
					t.Errorf("%s with %s down: %s and %s", s, down, ha, hb)
				}
			}
		})
	}
}

// TestStoreWarnsOfDifferentReplicaLists (issue 35, item 7): while the store
// is up, a proxy that shares it with one listing other replicas for a
// model it serves says so (a warning, and session_store.replica_mismatch
// in /api/status); the same replicas in another order, or a model only one
// serves, are no mismatch.
func TestStoreWarnsOfDifferentReplicaLists(t *testing.T) {
	rs := redistest.Start(t)
	loads := func(model string, reps ...string) []replicaLoad {
		var out []replicaLoad
		for _, r := range reps {
			out = append(out, replicaLoad{Model: model, Replica: r, TTL: time.Hour, Window: time.Minute})
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		a, b   []replicaLoad
		want   string // in a's mismatch; "" for none
		logged bool
	}{
		{"same replicas, other order", loads("m", "r0", "r1"), loads("m", "r1", "r0"), "", false},
		{"a model only one serves", loads("m", "r0"), append(loads("m", "r0"), loads("other", "x")...), "", false},
		{"one replica differs", loads("m", "r0", "r1"), loads("m", "r0", "r2"), "model m: only this proxy lists [r1], another lists [r2]", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			a, b := testStore(t, rs), testStore(t, rs)
			t.Cleanup(func() { a.leave(); b.leave() }) // the next case sees neither
			logs := &syncBuffer{}
			a.log = slog.New(slog.NewTextHandler(logs, nil))
			if err := b.sync(ctx, tc.b); err != nil {
				t.Fatal(err)
			}
			if err := a.sync(ctx, tc.a); err != nil {
				t.Fatal(err)
			}
			if got := a.State().Mismatch; got != tc.want {
				t.Errorf("mismatch %q, want %q", got, tc.want)
			}
			if got := strings.Contains(logs.String(), "level=WARN") && strings.Contains(logs.String(), "different replicas"); got != tc.logged {
				t.Errorf("warned %v, want %v; log:\n%s", got, tc.logged, logs)
			}
		})
	}
}
