//go:build race

package chaos_test

// raceEnabled makes the daemons under test race-enabled too when the tests
// are (go test -race).
const raceEnabled = true
