package sim

import "github.com/lm-warden/warden/traces"

// seq is one request inside a replica: vLLM's Request as far as the
// scheduler and the KV cache manager see it.
type seq struct {
	// The fields every engine step reads and writes come first, in two
	// cache lines: a seq is 320 bytes, a multiple of 64, so it starts at a
	// line (replica.schedule, EngineHistograms.stepScheduled,
	// replica.finishStep).
	numTokens int // prompt + generated so far (vLLM request.num_tokens)
	computed  int // tokens whose KV is computed or scheduled (num_computed_tokens)
	generated int
	output    int // tokens to generate (>= 1)
	// admitTokens is numTokens at the last admission: the prefill ends
	// when computed reaches it.
	admitTokens  int
	cachedBlocks int     // leading blocks already in the prefix cache
	firstTokenUs int64   // -1 until the first token
	lastTokenUs  int64   // the latest token (inter-token latency)
	blocks       []int32 // block table
	// hashEnd is 1 + the first block without a known hash (blockHash
	// fails from there on), once replica.cacheKnown met it; 0 before.
	hashEnd     int
	scheduledUs int64 // first scheduled, -1 before (vLLM's scheduled_ts)
	aborted     bool  // cut at a step end; removed when its step ends

	id     int // run-wide request number, in send order
	req    *traces.Request
	client int32 // closed loop: client slot; open loop: -1
	turn   int

	prompt       int // prompt tokens
	preemptions  int
	cachedTokens int   // prompt tokens served from the prefix cache at the first admission
	admitted     bool  // admitted at least once (its first lookup is counted)
	lengthCapped bool  // output == the workload's max_output_tokens (finished_reason "length")
	rejected     bool  // never fitted in a replica's KV cache: not routed
	epoch        int32 // closed loop: the step that sent it
	replica      int

	sentUs       int64 // reached the engine (vLLM's arrival_time)
	clientSentUs int64 // sent by the client (client-side TTFB starts here)
	censored     bool  // its TTFB was counted, censored, at a step's end
	ttfbUs       int64 // client-side TTFB as counted (censored: the wait then); -1 before
	stepSessions int   // the level of the step its TTFB counts in
	reason       uint8 // placement.Reason of its routing
	attempt      uint8 // 0, then 1, 2 for its client's retries after a refusal (run.retry)
	logged       bool  // its RequestRecord is written
	apiServer    int32 // the vLLM API server its connection reached (least-loaded), -1: none

	// memo are the cached blocks of its last lookup on replica memoReplica
	// (-1: none) while it waits, valid while that pool's evictions counter
	// is memoEvictions (replica.longestHit).
	memo          []int32
	memoReplica   int
	memoEvictions int64
	// memoEvictable of the first memoEvN blocks of memo were evictable
	// when the pool's refFlips was memoFlips (replica.evictableFor).
	memoEvictable, memoEvN int
	memoFlips              int64
	uncached               int32 // the router's prefill estimate (Decision.Uncached) until its first token
}

// blockHash returns the chained hash of full block k, if known: the
// prompt's HashIDs for blocks wholly inside the prompt, then the trace's
// OutputHashIDs for blocks completed by generated tokens; blocks beyond
// those have no hash and stay uncached, as does any partial block.
func (s *seq) blockHash(k, blockSize int) (uint64, bool) {
	return requestBlockHash(s.req, s.prompt, k, blockSize)
}

// requestBlockHash is seq.blockHash of a request of prompt tokens, in a
// replica or not.
func requestBlockHash(req *traces.Request, prompt, k, blockSize int) (uint64, bool) {
	if (k+1)*blockSize <= prompt { // k < prompt/blockSize, without a division
		if k < len(req.HashIDs) {
			return req.HashIDs[k], true
		}
		return 0, false
	}
	full := prompt / blockSize
	if full > len(req.HashIDs) {
		return 0, false // the chain broke inside the prompt
	}
	j := k - full
	if j < len(req.OutputHashIDs) {
		return req.OutputHashIDs[j], true
	}
	return 0, false
}

// seqQueue is a FIFO with a cheap push to the front (vLLM's waiting queue,
// into whose head preempted requests go back).
type seqQueue struct {
	buf  []*seq
	head int
	n    int
}

func (q *seqQueue) len() int { return q.n }

func (q *seqQueue) grow() {
	nb := make([]*seq, max(2*len(q.buf), 16))
	for i := range q.n {
		nb[i] = q.buf[(q.head+i)%len(q.buf)]
	}
	q.buf, q.head = nb, 0
}

func (q *seqQueue) pushBack(s *seq) {
	if q.n == len(q.buf) {
		q.grow()
	}
	q.buf[(q.head+q.n)%len(q.buf)] = s
	q.n++
}

func (q *seqQueue) pushFront(s *seq) {
	if q.n == len(q.buf) {
		q.grow()
	}
	q.head = (q.head - 1 + len(q.buf)) % len(q.buf)
	q.buf[q.head] = s
	q.n++
}

func (q *seqQueue) front() *seq { return q.buf[q.head] }

func (q *seqQueue) at(i int) *seq { return q.buf[(q.head+i)%len(q.buf)] }

func (q *seqQueue) popFront() *seq {
	s := q.buf[q.head]
	q.buf[q.head] = nil
	q.head = (q.head + 1) % len(q.buf)
	q.n--
	return s
}

// filter keeps the requests for which keep is true, in order.
func (q *seqQueue) filter(keep func(*seq) bool) {
	kept := 0
	for i := range q.n {
		s := q.at(i)
		if keep(s) {
			q.buf[(q.head+kept)%len(q.buf)] = s
			kept++
		}
	}
	for i := kept; i < q.n; i++ {
		q.buf[(q.head+i)%len(q.buf)] = nil
	}
	q.n = kept
}
