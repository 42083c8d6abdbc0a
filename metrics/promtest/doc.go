// Package promtest starts a real Prometheus server for tests.
//
// The server is the Debian package's binary (prometheus 2.42, found on PATH),
// bound to 127.0.0.1 on a free port, with its configuration and TSDB in the
// test's temporary directory. It scrapes the targets a test gives it, so
// that PromQL written for production (metrics/kpi.promql) is checked against
// the real query engine and the real scrape path, not only against the
// embedded engine. Native histograms are enabled
// (--enable-feature=native-histograms): a client_golang target is scraped
// in protobuf and its native histograms stored (Prometheus 2.42 then stores
// no classic _bucket, _sum or _count series for such a histogram); a target
// with text exposition only, like vLLM, is scraped as before.
//
// Where to start reading: promtest.go, [Start] and [Options]; then
// [Server.WaitScraped], [Server.Sync] and [Server.Query].
//
// Typical use:
//
//	srv := promtest.Start(t, promtest.Options{Targets: []string{"127.0.0.1:9100"}})
//	srv.WaitScraped(t, 2)          // every target scraped twice
//	// ... change the state of the targets ...
//	srv.Sync(t)                    // every target scraped again since this call
//	v := srv.Query(t, `sum(up)`, time.Now())
//
// Prometheus 2.42 applies a new target list at most every 5 seconds, so the
// first scrape comes about 5 s after [Start]: start the server before the
// rest of a test's setup, and call WaitScraped when that setup is done.
//
// When the prometheus binary is missing the test is skipped with the install
// command, except with CI=true, where it fails (CI installs the package).
// The server is stopped by t.Cleanup (SIGTERM, then SIGKILL after a grace
// period); its log is written to the test log when the test failed.
package promtest
