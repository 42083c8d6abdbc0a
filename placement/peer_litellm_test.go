package placement

import "testing"

// Golden cases taken from BerriAI/litellm's own tests
// (tests/local_testing/test_least_busy_routing.py @2b4986b).

// test_router_get_available_deployments: in flight {1: 10, 2: 54, 3: 100}:
// deployment 1.
func TestLiteLLM_RouterGetAvailableDeployments(t *testing.T) {
	l := NewLiteLLM(1)
	s := farm(3, 32)
	s.Replicas[0].InFlight, s.Replicas[1].InFlight, s.Replicas[2].InFlight = 10, 54, 100
	if d := pick(t, l, Request{Pinned: NoPin}, s, t0); d.Replica != 0 || d.Reason != ReasonLeastLoaded {
		t.Errorf("picked %+v, want 0 least-loaded", d)
	}
}

// test_router_completion_streaming: three streams started one after the
// other, each still in flight: one on each deployment.
func TestLiteLLM_RouterCompletionStreaming(t *testing.T) {
	l := NewLiteLLM(1)
	s := farm(3, 32)
	for range 3 {
		i := mustPick(t, l, Request{Pinned: NoPin}, s, t0)
		s.Replicas[i].InFlight++
	}
	for i, r := range s.Replicas {
		if r.InFlight != 1 {
			t.Errorf("deployment %d has %d calls, want 1", i, r.InFlight)
		}
	}
}

// _get_available_deployments: ties go to the deployment first called,
// and an unhealthy least-busy deployment sends the call to a random
// healthy one.
func TestLiteLLM_DictOrderAndUnhealthy(t *testing.T) {
	l := NewLiteLLM(1)
	s := farm(3, 32)
	s.Replicas[0].InFlight, s.Replicas[1].InFlight = 1, 1
	l.called(2)
	l.called(1)
	s.Replicas[2].InFlight = 1
	if got := mustPick(t, l, Request{Pinned: NoPin}, s, t0); got != 2 {
		t.Errorf("all at 1: picked %d, want 2 (first called)", got)
	}
	s.Replicas[2].Healthy = false
	s.Replicas[2].InFlight = 0
	seen := map[int]bool{}
	for range 40 {
		seen[mustPick(t, l, Request{Pinned: NoPin}, s, t0)] = true
	}
	if !seen[0] || !seen[1] || seen[2] {
		t.Errorf("least busy unhealthy: picked %v, want both healthy ones and never 2", seen)
	}
}
