// Package kvevents speaks vLLM's KV-cache events: the msgpack batches a
// vLLM engine started with --kv-events-config publishes over ZeroMQ each
// time its prefix cache stores or drops blocks. warden reads them to know
// what each replica really holds (stored minus removed), which
// vllm:kv_cache_usage_perc does not tell (it counts the blocks of running
// requests only), and why each computed block had to be computed (cold,
// evicted, elsewhere), as the simulator classifies its misses. The
// emulator (`warden emulate --kv-events`) publishes the same events, so the
// whole loop is tested without GPUs.
//
// The wire format is vLLM's own, read in vllm/distributed/kv_events.py:
//
//   - each message is three ZeroMQ frames, (topic, seq, payload), sent by
//     ZmqEventPublisher._publisher_thread on a PUB socket: seq is an 8-byte
//     big-endian counter from 0 (itertools.count), payload one msgspec
//     msgpack KVEventBatch;
//   - the payload is written by msgspec, whose rules decide the bytes:
//     an array_like struct is written whole, every field, a default too
//     (mpack_encode_struct_array in msgspec/_core.c: omit_defaults does not
//     apply, msgspec issue #720); a struct as a map leaves out the fields
//     equal to their default under omit_defaults
//     (mpack_encode_struct_object), a tagged one "type" first;
//   - an event is BlockStored, BlockRemoved or AllBlocksCleared
//     (KVCacheEvent, tag=True: the tag is the class name); KVEventBatch
//     (EventBatch) is ts (float64 Unix seconds), events and
//     data_parallel_rank (None by default; ZmqEventPublisher.publish sets
//     its own rank, PR #18925). Three forms followed each other (Form):
//     array, batch and events array_like ([ts, events, rank] with rank
//     nil when None; [tag, field...] with every field, BlockStored's 11
//     since PR #40984), from PR #16750; map, the events tagged maps
//     {"type": "BlockStored", "block_hashes": [...], ...} without their
//     defaults, the batch still positional (PR #42892, "[KV Events]
//     Switch event structs from array to map encoding"; vLLM 0.26.0,
//     volcano-sh/kthena#1535); batch-map, the batch a map too,
//     {"ts", "events", "data_parallel_rank"}, the rank left out when None
//     (vLLM main at 0181ea3). Decode reads all three, fields in any order,
//     fewer positional fields (older releases), unknown fields and event
//     types skipped; AppendBatch writes each byte for byte, and the golden
//     files under testdata/ hold each form;
//   - a block hash is ExternalBlockHash, int or bytes
//     (vllm/v1/core/kv_cache_utils.py): bytes unless
//     VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, whose int is the low 64 bits of
//     the bytes (maybe_convert_block_hash); both are read as that uint64,
//     so the two settings give the same keys;
//   - a subscriber that misses batches asks the optional ROUTER replay
//     socket (ZmqEventPublisher._service_replay) with the first sequence
//     number it lacks, 8 bytes big-endian; the publisher answers every
//     buffered batch from there as (seq, payload) and ends with seq -1 and
//     an empty payload.
//
// A publisher is a peer that can misbehave; what it can make warden hold,
// wait for and do is bounded (Limits): bytes and frames per message, a
// read deadline on the greeting, the handshake and each message, and a
// token bucket on batches and on block hashes per second, whose drops are
// counted and lost. Sequence numbers are the publisher's word: a jump
// further ahead than any engine publishes is a restart, and counters
// saturate rather than go negative.
//
// # Where to start reading
//
//   - wire.go: Batch, Event and their Kinds; decode.go: Decode (both forms,
//     every length bounded by the bytes that remain, nesting bounded);
//     encode.go: AppendBatch, byte for byte what msgspec writes.
//   - subscriber.go: Subscribe (dials, reconnects, replay on a gap,
//     Handler); listen.go: Listener, for publishers that connect (vLLM
//     connects when its endpoint has no "*", as llm-d deploys it), told
//     apart by topic and data-parallel rank (Router); stream.go: one publisher's sequence numbers (gaps,
//     restarts, duplicates from replay) and the bound on work;
//     zmtp.go: ZMTP over zmq4's Conn, each connection read through the
//     limits and deadlines; publisher.go: Publisher (PUB + ROUTER with a
//     replay buffer, for the emulator).
//   - ledger.go: Farm and its per-replica ledgers: blocks held, miss
//     classes, each bounded; Snapshot reads what each ledger last
//     published, without its lock. held.go: Leading, how many of a
//     prompt's block hashes a replica's prefix cache holds now, counted
//     from the first, as vLLM's find_longest_cache_hit would find them.
package kvevents
