// Package archtest is test support: archtest.go, Check and Rules, the
// layer rules a package's architecture test states (live, epp, kvevents:
// their arch_test.go; sim and placement keep their own), and TestSupport
// with TestOnlyViolations, which keep the test-support packages (this one,
// internal/fakevllm, ...) out of every non-test file (checked by this
// package's own TestSupportOnlyInTests).
package archtest
