//go:build !unix

package main

import "time"

// processCPU returns 0 where getrusage is unavailable: bench then prints
// no "client cpu/op" row.
func processCPU() time.Duration { return 0 }
