package live

import (
	"log/slog"
	"net/http"
	"testing"
)

// decider is a Server over two endpoints nothing listens on, not serving:
// its replicas are presumed healthy, so requests are placed.
func decider(t *testing.T) *Server {
	t.Helper()
	cfg, err := ParseConfig("epp.yaml", []byte("listen: 127.0.0.1:0\nauth: passthrough\nmodels:\n  - name: "+testModel+
		"\n    replicas: [http://127.0.0.1:1, http://127.0.0.1:2, http://127.0.0.1:3]\n"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(cfg, WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func inFlight(s *Server) map[string]int64 {
	out := map[string]int64{}
	for _, r := range s.Status().Models[0].Replicas {
		out[r.URL[len("http://"):]] = r.InFlight
	}
	return out
}

func decideChat(s *Server, session string, allowed func(string) bool) (*Decision, *Refusal) {
	return s.Decide(DecideInput{Path: "/v1/chat/completions", Header: http.Header{"X-Session-Id": {session}},
		Body: []byte(chatBody(testModel, session, 0, true)), Allowed: allowed})
}

// TestDecideServedMovesInFlight: a request the gateway retried on a
// fallback is counted where it was served, from the response's headers to
// its end; the session keeps its home.
func TestDecideServedMovesInFlight(t *testing.T) {
	s := decider(t)
	d, ref := decideChat(s, "a", nil)
	if ref != nil {
		t.Fatalf("refused: %d %s", ref.Status, ref.Body)
	}
	home := d.Endpoint()
	if fb := d.Fallbacks(); len(fb) != 2 || fb[0] == home || fb[1] == home {
		t.Fatalf("fallbacks %v of home %s: want the two others", fb, home)
	}
	if n := inFlight(s)[home]; n != 1 {
		t.Fatalf("home %s: %d in flight, want 1", home, n)
	}
	other := d.Fallbacks()[0]
	d.Served(other)
	if f := inFlight(s); f[home] != 0 || f[other] != 1 {
		t.Errorf("after Served(%s): %v, want the count moved there", other, f)
	}
	d.ResponseHeaders(200, "text/event-stream")
	d.ResponseBody([]byte("data: {\"usage\":{\"prompt_tokens\":900,\"completion_tokens\":5}}\n\ndata: [DONE]\n\n"))
	d.Finish()
	d.Finish() // once only
	for ep, n := range inFlight(s) {
		if n != 0 {
			t.Errorf("%s: %d in flight after Finish", ep, n)
		}
	}
	d2, ref := decideChat(s, "a", nil)
	if ref != nil {
		t.Fatal(ref.Status)
	}
	defer d2.Finish()
	if d2.Endpoint() != home {
		t.Errorf("next turn on %s, want home %s", d2.Endpoint(), home)
	}
}

// TestDecideSubset: the gateway's subset hint restricts the pick and the
// fallbacks; an empty subset is 503 in the client's shape, with nothing
// left counted.
func TestDecideSubset(t *testing.T) {
	s := decider(t)
	only := "127.0.0.1:3"
	for i := range 5 {
		d, ref := decideChat(s, string(rune('a'+i)), func(ep string) bool { return ep == only })
		if ref != nil {
			t.Fatalf("refused: %d %s", ref.Status, ref.Body)
		}
		if d.Endpoint() != only || len(d.Fallbacks()) != 0 {
			t.Errorf("picked %s %v, want only %s", d.Endpoint(), d.Fallbacks(), only)
		}
		d.Finish()
	}
	_, ref := decideChat(s, "z", func(string) bool { return false })
	if ref == nil || ref.Status != http.StatusServiceUnavailable || ref.Reason != "subset" {
		t.Fatalf("empty subset: %+v, want 503 subset", ref)
	}
	for ep, n := range inFlight(s) {
		if n != 0 {
			t.Errorf("%s: %d in flight after a refusal", ep, n)
		}
	}
}

// TestDecideHoldsNoBody (issue 46, item 5): the gateway sends the body
// itself, and Decide reads the body its caller holds (and counts against
// limits.max_body_bytes_in_flight) in place: it holds none of its own.
// Before: a copy was held until Finish, a stream's whole length.
func TestDecideHoldsNoBody(t *testing.T) {
	s := decider(t)
	d, ref := decideChat(s, "a", nil)
	if ref != nil {
		t.Fatalf("refused: %d %s", ref.Status, ref.Body)
	}
	defer d.Finish()
	if n := s.bodies.Held(); n != 0 {
		t.Errorf("%d bytes of body held after Decide, want 0", n)
	}
}
