package placement

import (
	"fmt"
	"hash/crc32"
	"testing"
)

// nginx's upstream hash module has no unit tests of its own in the nginx
// tree; these pin the behaviour its documentation states
// (ngx_http_upstream_hash_module: "consistent" is ketama, 160 points per
// weight, Cache::Memcached::Fast compatible).

func TestNginxHash_Ring(t *testing.T) {
	// nginx's crc32 is CRC-32/IEEE: the standard check value.
	if got := crc32.ChecksumIEEE([]byte("123456789")); got != 0xcbf43926 {
		t.Fatalf("crc32 check value %08x", got)
	}
	pts := nginxPoints("10.0.0.1:8000", nil)
	if len(pts) != 160 || pts[0] != crc32.Update(crc32.ChecksumIEEE([]byte("10.0.0.1\x008000")), crc32.IEEETable, []byte{0, 0, 0, 0}) {
		t.Fatalf("points: %d, first %08x", len(pts), pts[0])
	}
	h := &NginxHash{}
	s := farm(4, 32)
	counts := make([]int, 4)
	for k := range 400 {
		counts[mustPick(t, h, Request{Session: fmt.Sprintf("sess-%d", k), Pinned: NoPin}, s, t0)]++
	}
	for i, n := range counts {
		if n < 40 {
			t.Errorf("server %d got %d of 400 sessions (%v)", i, n, counts)
		}
	}
}

// A missing header hashes "": every header-less request on one server.
func TestNginxHash_MissingHeaderOneServer(t *testing.T) {
	h := &NginxHash{}
	s := farm(4, 32)
	first := mustPick(t, h, Request{Pinned: NoPin}, s, t0)
	for range 10 {
		if got := mustPick(t, h, Request{Pinned: NoPin}, s, t0); got != first {
			t.Fatalf("header-less requests on %d and %d", first, got)
		}
	}
}

// A down server passes its keys to the next point's server; the others
// keep theirs.
func TestNginxHash_DownServerNextPoint(t *testing.T) {
	h := &NginxHash{}
	s := farm(4, 32)
	before := make([]int, 200)
	for k := range before {
		before[k] = mustPick(t, h, Request{Session: fmt.Sprintf("sess-%d", k), Pinned: NoPin}, s, t0)
	}
	s.Replicas[1].Healthy = false
	for k := range before {
		got := mustPick(t, h, Request{Session: fmt.Sprintf("sess-%d", k), Pinned: NoPin}, s, t0)
		if got == 1 || (before[k] != 1 && got != before[k]) {
			t.Errorf("sess-%d: %d -> %d with server 1 down", k, before[k], got)
		}
	}
}
