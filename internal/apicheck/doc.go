// Package apicheck holds the test that keeps the public packages' APIs
// public: no exported identifier of a package outside internal/ and cmd/ may
// mention a type from an internal package, since a user of that API could
// not name it. It has no code of its own.
package apicheck
