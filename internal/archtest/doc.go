// Package archtest is test support: archtest.go, Check and Rules, the
// layer rules a package's architecture test states (live, epp, kvevents:
// their arch_test.go; sim and placement keep their own).
package archtest
