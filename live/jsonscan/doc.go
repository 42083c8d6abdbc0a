// Package jsonscan validates a request body as JSON and reads the handful
// of top-level fields the proxy routes by, in one pass, without decoding
// the prompts: live's request path (decodeBody) and its answers' usage
// (MemberValue) run on it.
//
// Where to start reading:
//
//   - jsonscan.go: Scan, a strict RFC 8259 validator that hands only the
//     values of the keys the proxy reads (Body: model, stream,
//     metadata.user_id, prompt_cache_key, user; and, raw, the system,
//     messages, instructions, input and prompt the fallback session id
//     hashes: Body.Fallback) to encoding/json. Keys are compared after
//     unescaping, exactly, as vLLM's Python does, and a key the proxy
//     reads given twice is refused (ErrDuplicateKey). MemberValue finds
//     one top-level member of an answer (its usage).
//   - jsonblock.go: the string scanner's block path (64 bytes classified
//     at once into bit masks) and ValidUTF8, which passes over ASCII runs.
//   - jsonblock_amd64.go, jsonblock_amd64.s: the AVX2 block masks and
//     ASCII prefix; jsonblock_other.go: their stand-ins on every other
//     architecture, and under the purego build tag (what make test runs
//     too).
//
// Tests: table tests against encoding/json, fuzz targets (FuzzScanBody,
// FuzzMemberValue, FuzzValidUTF8) holding the block path to the
// word-at-a-time one and both to encoding/json and utf8.Valid.
package jsonscan
