// Package vm tests power loss: see the package documentation in powercut_test.go.
package vm
