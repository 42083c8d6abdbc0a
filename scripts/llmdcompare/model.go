package main

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/traces"
)

// The prompt as warden's model of llm-d sees it. Two ways:
//
//   - proxyView: as warden's proxy would give it, the canonical text's
//     16-token blocks (traces.PromptText, traces.TextBlockIDs), which the
//     model turns into text by the rule of placement/doc.go ("The prompt
//     as text") and cuts into the EPP's 64-pseudo-token blocks.
//   - eppView: the bytes the EPP's estimate tokenizer reads (eppBytes),
//     cut into blocks of 64 pseudo-tokens (256 bytes) whose chained ids
//     are equal exactly when the EPP's block hashes are: the model then
//     sees the EPP's own block boundaries, so any disagreement left is the
//     model's logic or its inputs, not the tokenization.
type view int

const (
	proxyView view = iota
	eppView
)

func (v view) String() string {
	if v == eppView {
		return "the EPP's own bytes (64-pseudo-token blocks)"
	}
	return "warden's proxy view (canonical text, 16-token blocks)"
}

// eppBlockTokens is the EPP's block size in pseudo-tokens: max(64, vLLM's
// block_size 16) (approximateprefix GetBlockSize, minBlockSizeTokens).
const eppBlockTokens = 64

// eppBytes is the byte stream the EPP's estimate tokenizer packs into
// pseudo-tokens for a chat completion without tools: each message's role
// then its text, nothing between (llm-d-router ebab687,
// pkg/epp/framework/plugins/requestcontrol/dataproducer/tokenizer/estimate.go
// chatCompletionsBytes, appendChatMessage), zero-padded to a multiple of 4
// bytes (packBytes, align).
func eppBytes(msgs []message) []byte {
	var out []byte
	for _, m := range msgs {
		out = append(out, m.Role...)
		out = append(out, m.Content...)
	}
	if r := len(out) % 4; r != 0 {
		out = append(out, make([]byte, 4-r)...)
	}
	return out
}

// eppBlocks returns the EPP's blocks of b (eppBytes) as chained ids:
// 256 bytes a block, the last partial block hashed too (prefixhash
// getKVCacheBlocksFromTokens), with an id no full block has.
func eppBlocks(b []byte) []uint64 {
	const size = eppBlockTokens * 4
	var ids []uint64
	var prev uint64
	var buf [8]byte
	for lo := 0; lo < len(b); lo += size {
		hi := min(lo+size, len(b))
		d := xxhash.New()
		binary.LittleEndian.PutUint64(buf[:], prev)
		_, _ = d.Write(buf[:])
		_, _ = d.Write(b[lo:hi])
		if hi-lo < size {
			_, _ = d.Write([]byte("partial"))
		}
		prev = d.Sum64()
		ids = append(ids, prev)
	}
	return ids
}

// eppTotalBlocks is the number of blocks the EPP hashes for msgs.
func eppTotalBlocks(msgs []message) int {
	n := len(eppBytes(msgs)) / 4
	return (n + eppBlockTokens - 1) / eppBlockTokens
}

// textKey keys the canonical blocks' ids (the proxy keeps one per process).
var textKey = []byte("llmdcompare")

// request is the placement request of a turn in view v.
func request(model string, body []byte, v view) (placement.Request, error) {
	r := placement.Request{Model: model, Pinned: placement.NoPin}
	switch v {
	case eppView:
		cr, err := parseChat(body)
		if err != nil {
			return r, fmt.Errorf("the request body: %w", err)
		}
		b := eppBytes(cr.Messages)
		r.PromptTokens = len(b) / 4
		r.Prompt = placement.Prompt{BlockTokens: eppBlockTokens, Blocks: eppBlocks(b)}
	default:
		text := traces.PromptText(body, traces.DialectOpenAI)
		r.PromptTokens = traces.TextTokens(text)
		r.Prompt = placement.Prompt{BlockTokens: traces.TextBlockTokens, Blocks: traces.TextBlockIDs(textKey, text, r.PromptTokens)}
	}
	return r, nil
}

// replicaState is what the EPP read of one replica at a pick.
type replicaState struct {
	Waiting          int     `json:"waiting"`
	KVUsage          float64 `json:"kv_usage"`
	KVCapacityTokens int     `json:"kv_capacity_tokens"` // num_gpu_blocks x block_size (cache_config_info)
}

// snapshot is the placement snapshot of states.
func snapshot(states []replicaState) *placement.Snapshot {
	s := &placement.Snapshot{Replicas: make([]placement.Replica, len(states))}
	for i, st := range states {
		s.Replicas[i] = placement.Replica{ID: i, Healthy: true, Waiting: st.Waiting, KVUsage: st.KVUsage,
			KVCapacityTokens: st.KVCapacityTokens}
	}
	return s
}

// scorer is the part of placement.LLMD the comparison reads.
type scorer interface {
	placement.Policy
	Scores(dst []float64) []float64
}

// newModel returns warden's model of the EPP, placement.NewPeer("llm-d").
func newModel(seed uint64) (scorer, error) {
	p, ok := placement.NewPeer(placement.PeerLLMD, seed)
	if !ok {
		return nil, fmt.Errorf("placement has no peer %q", placement.PeerLLMD)
	}
	s, ok := p.(scorer)
	if !ok {
		return nil, fmt.Errorf("placement's %q policy (%T) does not report its scores", placement.PeerLLMD, p)
	}
	return s, nil
}

// epoch is the clock the model is given (it reads none).
var epoch = time.Unix(0, 0)

// modelPick is the model's decision at one turn and its scores.
type modelPick struct {
	replica int
	scores  []float64
}

// follow returns the model's pick at turn k of turns, its history being
// the EPP's: a fresh model replays turns 0..k-1, each placed where the
// EPP placed it (the only healthy replica of its snapshot, so that the
// model's own PreRequest records the prompt there), then picks turn k on
// the state the EPP saw. Each pick is thus judged on the same history,
// and one disagreement does not carry into the next turns.
func follow(turns []turnRecord, reqs []placement.Request, k int, seed uint64) (modelPick, error) {
	m, err := newModel(seed)
	if err != nil {
		return modelPick{}, err
	}
	for j := range k {
		s := snapshot(turns[j].State)
		for i := range s.Replicas {
			s.Replicas[i].Healthy = i == turns[j].EPP
		}
		d, err := m.Pick(&reqs[j], s, epoch)
		if err != nil || d.Replica != turns[j].EPP {
			return modelPick{}, fmt.Errorf("replaying turn %d onto replica %d: got %d, %v", j, turns[j].EPP, d.Replica, err)
		}
	}
	d, err := m.Pick(&reqs[k], snapshot(turns[k].State), epoch)
	if err != nil {
		return modelPick{}, err
	}
	return modelPick{replica: d.Replica, scores: m.Scores(nil)}, nil
}
