// Package rawbackend is test support for live and live/upstream: a
// backend on 127.0.0.1 that writes raw bytes (rawbackend.go: Start,
// Server, WriteOK).
package rawbackend
