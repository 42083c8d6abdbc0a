// Package upstream is the proxy's byte path below the request handler:
// the HTTP/1.1 client for the replicas, the request bodies' buffers and
// the sockets read and written with raw syscalls. It knows nothing of
// models, sessions or placement; package live drives it.
//
// Where to start reading:
//
//   - upstream.go: Client (New), the HTTP/1.1 client for the replicas.
//     The body is in memory, so an attempt (Do) is synchronous on the
//     caller's goroutine: one writev of head and body, the response head
//     read with http.ReadResponse, an idle pool per replica (idle
//     connections closed after 4 s, before uvicorn's 5 s), a request that
//     meets a connection the replica closed meanwhile sent again on a new
//     one; https replicas go through the fallback http.RoundTripper. What
//     a replica can make it hold is bounded: a reply head of at most
//     MaxReplyHeadBytes, at most 5 informational replies, a status within
//     100-599; beyond, the reply is ErrBadReply.
//   - bodybuf.go: Body, a request body read whole (ReadBody) into a buffer
//     from a free list that garbage collection does not empty, sized by
//     what has arrived on the client's socket (Arrivals) and counted
//     against a Budget (limits.max_body_bytes_in_flight:
//     OverBudgetError); CopyBuffers, the response copy buffers from the
//     same free list.
//   - rawconn_linux.go: rawConn, a TCP connection read and written with
//     RawSyscall so that the runtime's sysmon thread is not woken at each
//     busy stretch (issue 13 item 12); for a client (WrapClient) it gives
//     its slot back to its Owner when closed, bounds a write that makes
//     no progress by the Owner's WriteTimeout, and holds at most 32 KiB
//     unsent (TCP_NOTSENT_LOWAT). FDLimit reads the file descriptor limit.
//   - rawconn_other.go: the same names on other systems, over net.Conn.
//   - clientconn.go: Owner, and clientConn, a client's connection that is
//     not a rawConn (another kind of listener, another OS).
//
// Tests run against a raw-bytes backend on 127.0.0.1
// (live/internal/rawbackend) and real sockets; FuzzRequestHead holds the
// request head to net/http's reading of it.
package upstream
