// Package pkgdoc holds a module-wide test, and no code: every package's
// reading guide names each of its files (pkgdoc_test.go,
// TestReadingGuidesNameEveryFile), so that a newcomer who starts at a
// package's doc.go reaches every file of it.
package pkgdoc
