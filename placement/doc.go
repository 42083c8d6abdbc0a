// Package placement decides which vLLM replica serves a request. It is the
// shared heart of LM Warden: the simulator (package sim) and the live proxy
// (package live) run exactly this code, so a prediction and a production
// decision cannot drift apart.
//
// The package is pure: no I/O, no goroutines, no clock (now is always an
// argument), no global random source, and no map iterated into output;
// per-replica scores and counters are slices aligned with
// Snapshot.Replicas. TestPackageIsPure keeps it so. Policies are not safe
// for concurrent use; the proxy serialises Pick with a mutex.
//
// # Where to start reading
//
//   - placement.go: the contract. Replica and Snapshot (what a policy may
//     observe), Request, Decision with its Reason, Policy, and
//     ErrNoHealthyReplica.
//   - router.go: Router, the code that drives a policy, written once for
//     the simulator and the proxy: the session table (the policy's, or an
//     observer table), the snapshot's conversation figures, the pick, each
//     request's start and end, the hits its answer reports, the admission
//     rule. What a policy needs beyond Pick it offers through small
//     interfaces (SessionKeeper, TableAdopter, Admitter, Traiter); no
//     caller casts to a concrete policy.
//   - registry.go: the registry, every strategy by name, the product's
//     and the peers' (Strategy: words, reasons, options, whether the proxy
//     serves it, whether it is a peer's router, its factory), New,
//     and the spec grammar NAME[+OPTION[=VALUE]]... parsed once
//     (ParseSpec, Spec.Label, Spec.Apply) for warden sim, plan, tune, the
//     proxy's config check, the plan's glossary and calibrate.
//   - config.go: Config and the spill threshold ("auto" =
//     max(1, max_num_seqs/4), or a number).
//   - affinity.go: Affinity, the product (pinned, then sticky or spill,
//     then new or a subagent on its parent's home), and its load score.
//   - kv.go: the KV-aware options of Affinity (balance kv, the priced
//     spill, admission kv) and WaitQueue, the caller's admission FIFO.
//   - observed.go: observed hits per conversation (Table.ObserveHits:
//     what each answer says its replica served from cache) and the
//     cold-at-home rule (Config.Rehome cold, reason rehome).
//   - prefix.go: the held prefix (Config.Prefix held): what each replica
//     holds of this prompt now (Prompt.Held, from the caller's HeldIndex:
//     the proxy's KV events, the simulator's block pools) moves a
//     conversation its home has lost before the turn is sent, and places
//     one without a session id, or a subagent, where its prefix is.
//   - leastloaded.go: LeastLoaded, vLLM's own data-parallel balancer
//     (4*waiting + running), with notes on where it follows vLLM and where
//     it differs. Affinity switched off is this policy.
//   - hash.go: Hash, rendezvous hashing of the session id.
//   - table.go: Table, the session table (session -> home, last seen) with
//     idle TTL, hard cap with LRU eviction, and per-replica counters: the
//     conversations homed on each replica (Sessions) and the active ones
//     among them, seen within the active window (Active), which is what
//     placement balances; and the held ones (Held: a request in flight or
//     expected back within their return timeout, from the turn ends the
//     caller reports with Start and Finish), whose KV admission counts.
//     held.go keeps them: the conversations' footprints, their think-time
//     gaps and return timeouts, and the heap of scheduled releases.
//     activity.go: the active window learned from those gaps (unless
//     Config.ActiveWindow fixes it), so that a paused conversation still
//     counts on its home.
//   - prompt.go: Prompt, what a prefix-aware policy knows of a request's
//     prompt (its chained block ids and, from KV events or the
//     simulator's block pools, how many of them each replica holds now);
//     vtext.go: the prompt as text (below).
//   - peers.go: the routers people run instead of warden
//     (notes/peer-routers.md), each a Policy in its own file, named and
//     built by NewPeer, with the hooks a caller looks for: Tracker (first
//     token and end of each request it placed), Scraper (the interval at
//     which it reads vLLM's gauges), HeldReader (it reads Prompt.Held).
//     peer_llmd.go (llm-d, llm-d-precise), peer_dynamo.go (with
//     peer_dynamo_blocks.go, its index of every worker's active blocks,
//     on peer_idtable.go's open-addressing table of block ids),
//     peer_sglang.go (sglang, vllm-router), peer_vllmrouter.go
//     (vllm-router-hash), peer_prodstack.go, peer_ray.go, peer_aibrix.go,
//     peer_litellm.go, peer_nginx.go; radixtree.go is the character tree
//     SGLang's router keeps and Ray's ported, lruset.go the LRU of hashes
//     llm-d's indexer keeps. Each file cites the peer's source and commit,
//     says what it keeps and reads, and what is not modelled; its golden
//     tests (peer_*_test.go) are named after the peer's own tests.
//
// # The prompt as text
//
// The simulator has no text, and the peers that read characters (SGLang's
// and Ray's radix trees) or bytes packed into
// pseudo-tokens (llm-d's estimate, AIBrix's 4-byte blocks) need some. The
// rule: one token is TextBytesPerToken = 4 bytes, as llm-d's estimate
// packs them and as the proxy's canonical text counts them; the text of
// prompt block j (BlockTokens tokens, fewer for a last partial block) is
// 4 x its tokens bytes, byte k of it byte k%8 of mix64(id_j + (k/8+1) x
// 0x9e3779b97f4a7c15), id_j the block's chained id. Equal prefixes give
// equal text, as their ids are equal; two prompts that diverge do so at
// the first block whose ids differ, and from its first byte but for the
// 1 in 256 chance that derived bytes agree (a real divergence falls
// anywhere inside that block: the model loses at most one block of
// matched characters). A last partial block has an id no full block has,
// so the next turn's full block does not extend its text. The text is
// never built: a vtext holds (id, offset, length) pieces, compared and
// hashed piece by piece. Where a peer hashes the text (llm-d's xxhash64
// chain, AIBrix's 4-byte blocks) it hashes the
// pieces' description: equal text, equal hash, as with the bytes; those
// hashes decide placement only and are never compared with a peer's own.
//
// # Adding a strategy
//
// Two files, as BLIS's extension recipes count them
// (docs/contributing/extension-recipes.md there):
//
//  1. placement/NAME.go: the policy (a type with Pick, pure like the rest
//     of the package) and its Strategy value: Name, Words (what it does
//     with a turn, in plain words), the Reasons it gives, its Options if
//     it takes any, Proxy if the proxy serves it, and New. If it reads more
//     than the Replica basics it says so with Traits (TraitKV: capacities,
//     prefill rates and footprints; TraitAdmission: it may answer Wait),
//     and if it keeps conversations it offers its table (SessionKeeper,
//     TableAdopter); the Router feeds it, the callers never name its type.
//     A peer's router sets Peer (it joins the head-to-head, the group
//     "peers" of a strategy list); a strategy of warden's own that belongs
//     there lists the specs to run in HeadToHead.
//  2. placement/registry.go: one line, &nameStrategy, in registry.
//
// Its golden tests go next to it (NAME_test.go, testdata/scenarios). From
// then on warden sim --strategies NAME (and peers, if it is one),
// warden plan --strategies NAME,
// warden tune --variants NAME, a farm's routing.strategy, the plan's
// glossary, calibrate's inference from the reasons and, with Proxy set,
// the proxy's models[].strategy take it; TestSeamArchitecture fails if any
// code outside placement names its type or spells its name.
//
// Before the registry and the Router the same change touched at least 9
// files in 6 packages: placement/config.go (the name, Strategies, New),
// live/configresolve.go (the accepted names), live/model.go and
// live/admission.go (casts to *Affinity for the table and admission),
// live/pick.go (which strategy is sticky), sim/routing.go (casts for the
// KV inputs and observed hits, the option grammar), planner/glossary.go
// (its words), calibrate/observe.go (its reasons) and cmd/warden/tune.go
// (the default variants and the help).
//
// Every strategy honours a valid pin (Request.Pinned in range and healthy),
// never picks an unhealthy replica, and returns an error wrapping
// ErrNoHealthyReplica when nothing is healthy.
//
// # Golden scenarios
//
// testdata/scenarios/*.txt are readable scenarios: replicas' state and a
// sequence of requests, each with the expected pick and reason. TestScenarios
// runs them; go test -run TestScenarios -update rewrites every expected part
// from the actual decisions (review the diff). FuzzScenario fuzzes the
// parser and checks that a rewritten file replays cleanly.
//
// One directive per line; "#" starts a comment (to the end of the line);
// blank lines are ignored. The first directive is replicas; at the start
// every replica is healthy and idle and the clock is at 0s.
//
//	replicas N [max_num_seqs M]        the farm: N replicas, IDs 0..N-1
//	policy NAME [key=value...]         hash, least-loaded or affinity; affinity
//	                                   takes spill=auto|priced|N, ttl=DURATION,
//	                                   active_window=DURATION, max_sessions=N,
//	                                   disabled=true|false, balance=sessions|kv,
//	                                   admission=off|kv, admission_timeout=DURATION
//	                                   (the runner's WaitQueue), rehome=off|cold,
//	                                   prefix=off|held
//	state ID|all key=value...          set inflight=, running=, waiting=, kv=
//	                                   (0..1), kv_capacity=, prefill_rate=
//	                                   (tokens/s), prefill_queue=, healthy= of
//	                                   one or all replicas
//	scrape                             a stats update: Snapshot.Generation+1
//	at DURATION                        move the clock to 0s + DURATION (10s, 5m);
//	                                   it never runs backwards
//	pick [session=S] [parent=S] [pinned=ID] -> ID REASON | none
//	                                   one decision; "none" expects an error
//	                                   wrapping ErrNoHealthyReplica; also
//	                                   prompt=N, shared=N (tokens), held=T,T,...
//	                                   (tokens of the prompt each replica holds:
//	                                   Prompt.Held, blocks of 16); "-> wait":
//	                                   held for admission, queued FIFO by the
//	                                   runner as a caller would (MustQueue)
//	observe session=S tokens=N         Table.Observe: a response's prompt + answer
//	served session=S replica=ID prompt=N cached=N [answer=N]
//	                                   Table.ObserveHits: what a response says
//	                                   its replica served from cache (-1: unknown)
//	start session=S                    Table.Start: a request of S was sent
//	finish session=S [tokens=N]        Table.Finish: it ended (with its prompt +
//	                                   answer); S stays held for its return timeout
//	end session=S                      Table.Remove: the conversation ended
//	admit -> session=S ID REASON | wait | empty
//	                                   ask again for the front of the wait queue
//	expire -> S[,S...] | none          pop those waiting longer than
//	                                   admission_timeout
//	home session=S -> ID | none        affinity only: Table.Home
//	expect sessions=N                  affinity only: Table.Len
//	expect replica ID name=N...        affinity only: that replica's counters
//	                                   (sessions, active, new, parent,
//	                                   sticky, spilled_in, pinned, footprint,
//	                                   held, held_footprint, rehomed); the ones listed
//	                                   are checked
//
// For example:
//
//	replicas 4 max_num_seqs 32         # spill threshold auto = 8
//	policy affinity
//	pick session=a -> 0 new
//	state 0 inflight=9
//	pick session=a -> 1 spill
//	expect replica 1 spilled_in=1
//
// Picks do not change the replicas' state: in-flight and the scraped
// fields change only through state lines, so each file shows exactly what
// a policy saw.
package placement
