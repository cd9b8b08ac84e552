// Package archtest holds no code, only a test: arch_test.go enforces the
// import arrows and the purity rules of DESIGN.md over every package of the
// module, so that a forbidden import or a clock read in the pure core fails
// `go test ./...` instead of waiting for a reviewer to notice.
//
// The table of layers in arch_test.go is the executable form of the
// "Layout" section of DESIGN.md. A new package must be added to it, with
// what it may import and why; the test fails until it is.
package archtest
