package main

import (
	"fmt"
	"time"

	"github.com/capledger/capledger/ledger"
)

// The ranges of the numeric flags are checked right after the flags are
// parsed, before anything listens, opens or sends: a value outside its
// range is a usage error (exit 1) naming the flag, the value given and
// the range, never a panic, a silent clamp or a hang later on. The
// ranges are in each command's --help and in docs/OPERATIONS.md.

// maxAPIDuration is the API's single maximum for a duration, 9223372036s
// (ledger.MaxDurationSeconds, docs/API.md "Durations"): a flag sent as a
// Duration is refused above it, as the server would refuse it.
const maxAPIDuration = time.Duration(ledger.MaxDurationSeconds) * time.Second

// intIn returns nil when value, given as --name, is in [least, most], else
// the usage error saying so.
func intIn[N int | int64](name string, value, least, most N) error {
	if value < least || value > most {
		return usagef("--%s %d: want %d to %d", name, value, least, most)
	}
	return nil
}

// durationIn returns nil when value, given as --name, is in [least,
// most], else the usage error saying so.
func durationIn(name string, value, least, most time.Duration) error {
	if value < least || value > most {
		return usagef("--%s %s: want %s to %s", name, value, least, mostText(most))
	}
	return nil
}

// durationOffOrIn is durationIn for a flag whose 0 turns something off
// (what says what): 0 is accepted beside [least, most].
func durationOffOrIn(name string, value, least, most time.Duration, what string) error {
	if value != 0 && (value < least || value > most) {
		return usagef("--%s %s: want 0 (%s) or %s to %s", name, value, what, least, mostText(most))
	}
	return nil
}

// mostText is a range's upper end; the API's maximum also as the API
// writes it, for that is the number docs/API.md gives.
func mostText(most time.Duration) string {
	if most == maxAPIDuration {
		return fmt.Sprintf("%s (%ds, the API's longest duration)", most, ledger.MaxDurationSeconds)
	}
	return most.String()
}

// firstError returns the first of errs that is not nil.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
