package placement

import (
	"fmt"
	"testing"
	"time"
)

// benchTurn is one request of the peers' benchmark workload.
type benchTurn struct {
	session string
	sess    int
	prompt  Prompt
}

// benchConversations is sessions agent conversations in the shape of
// sim.Workload58k, as the simulator hands them to a policy: a 3.5k-token
// system prompt shared by all, a 40k first message, then five turns each
// adding 2.8k new tokens and a 200-token answer (~58k tokens at the last
// turn), in blocks of 16 tokens; the turns interleaved (turn 0 of every
// session, then turn 1, ...), as concurrent sessions send them.
func benchConversations(sessions int) []benchTurn {
	const bs = 16
	chain := func(prev uint64, n int, salt uint64, dst []uint64) []uint64 {
		for k := range n {
			prev = mix64(prev ^ mix64(salt+uint64(k)+1))
			dst = append(dst, prev)
		}
		return dst
	}
	system := chain(0x73797374656d, 3500/bs, 1, nil)
	var perSession [][]uint64
	var lengths [][]int
	for s := range sessions {
		blocks := append(make([]uint64, 0, 58000/bs+16), system...)
		blocks = chain(blocks[len(blocks)-1], 40000/bs, uint64(s)<<32, blocks)
		ls := []int{len(blocks)}
		for t := 1; t < 6; t++ {
			blocks = chain(blocks[len(blocks)-1], (2800+200)/bs, uint64(s)<<32|uint64(t)<<20, blocks)
			ls = append(ls, len(blocks))
		}
		perSession = append(perSession, blocks)
		lengths = append(lengths, ls)
	}
	var out []benchTurn
	for t := range 6 {
		for s := range sessions {
			out = append(out, benchTurn{
				session: fmt.Sprintf("session-%d", s),
				sess:    s,
				prompt:  Prompt{BlockTokens: bs, Blocks: perSession[s][:lengths[s][t]]},
			})
		}
	}
	return out
}

// BenchmarkPeerPick times one decision of each peer's policy at 64
// replicas on realistic prompts (~40-58k tokens), against affinity's
// Pick on the same requests. A policy that follows requests (Tracker) is
// told of each one's first token and end right after it is placed; a
// policy that reads Prompt.Held sees the previous turn's blocks held on
// the replica that served it.
func BenchmarkPeerPick(b *testing.B) {
	const n = 64
	turns := benchConversations(256)
	names := append([]string{StrategyAffinity}, PeerNames()...)
	for _, name := range names {
		b.Run(name, func(b *testing.B) {
			var p Policy
			if name == StrategyAffinity {
				p = NewAffinity(Config{})
			} else {
				p, _ = NewPeer(name, 1)
			}
			s := farm(n, 256)
			for i := range s.Replicas {
				s.Replicas[i].InFlight = 1 + i%5
				s.Replicas[i].Waiting = i % 3
				s.Replicas[i].KVUsage = float64(i%10) / 10
				s.Replicas[i].KVCapacityTokens = 40000 * 16
			}
			tr, _ := p.(Tracker)
			hr, _ := p.(HeldReader)
			reads := hr != nil && hr.ReadsHeld()
			last := make([]int, 256)
			lastLen := make([]int, 256)
			for i := range last {
				last[i] = -1
			}
			held := make([]int, n)
			now := t0
			r := Request{Pinned: NoPin, Model: "m"}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				t := &turns[i%len(turns)]
				r.Session, r.ID, r.Prompt = t.session, uint64(i), t.prompt
				r.PromptTokens = len(t.prompt.Blocks) * t.prompt.BlockTokens
				r.Prompt.Held = nil
				if reads {
					clear(held)
					if h := last[t.sess]; h >= 0 {
						held[h] = lastLen[t.sess]
					}
					r.Prompt.Held = held
				}
				now = now.Add(10 * time.Millisecond)
				d, err := p.Pick(&r, s, now)
				if err != nil {
					b.Fatal(err)
				}
				last[t.sess], lastLen[t.sess] = d.Replica, len(t.prompt.Blocks)
				if tr != nil {
					tr.FirstToken(&r, d.Replica, now)
					tr.Finished(&r, d.Replica, now)
				}
				i++
			}
		})
	}
}
