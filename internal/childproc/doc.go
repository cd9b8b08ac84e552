// Package childproc ties a test's child processes (a serve replica, a
// Redis, a gubernator) to the test binary's life. go test kills a test
// binary that passes its -timeout; without this its children, which no
// Cleanup then stops, go on serving on their ports and holding their data
// directories and PostgreSQL sessions into the next run.
package childproc
