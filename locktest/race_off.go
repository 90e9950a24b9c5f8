//go:build !race

package locktest

// raceScale stretches the watchdog's bound under the race detector,
// which slows every call several times.
const raceScale = 1
