// Package redistest starts a real redis-server on 127.0.0.1 for tests (the
// session store of several proxies, see live's session_store), with
// persistence off, and stops it when the test ends. Stop and Start again
// on the same port rehearse a store that goes away and comes back.
//
// redistest.go: Start, Server (Stop, Restart, URL, Client: a client to
// plant keys with).
//
// A missing redis-server skips the test with the install command, except
// with CI=true, where it fails (CI installs the package).
package redistest
