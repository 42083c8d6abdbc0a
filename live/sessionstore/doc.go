// Package sessionstore is the state several proxies share (config key
// session_store): each conversation's home with its idle TTL, the
// conversations held per replica, and every proxy's in-flight counts.
// live owns the request path and the local table (placement.Table); it
// talks to the store through the Store interface, and placement never
// sees it.
//
// Where to start reading:
//
//   - store.go: Store (Claim, Touch, Remote, Up, Down, State, Run), Load
//     (what a proxy publishes per replica), Status (/api/status), and
//     Redis, the implementation in Redis (OpenRedis, ParseURL): the key
//     layout (Prefix, HeldKey, LoadField, ProxiesKey), its Lua scripts,
//     the up/down hysteresis over time (3 failures spanning 1 s down, 3
//     successes spanning 1 s up), and the bounds on what other proxies'
//     records can make a proxy hold or do (keys of the wrong type or size
//     skipped and counted, others' counts trusted up to Load.Cap, the
//     touches, peers and bytes of one sync capped).
//   - storereply.go: replyGuard, which reads every reply's announced
//     sizes (RESP2) as it arrives, so that a server that is not the Redis
//     it should be cannot make the proxy hold more than maxStoreReply.
//
// Sessions arrive already HMAC-hashed (session_key), never raw. Tests run
// a real redis-server (live/redistest), a relay that stalls or delays its
// replies, and a hand-written RESP server that answers hostile replies.
package sessionstore
