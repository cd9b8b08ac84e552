package postgres

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// Every index a migration after the first builds on an existing table is a
// plain CREATE INDEX inside the migration's transaction, which blocks
// writes to that table while it builds. OPERATIONS.md ("PostgreSQL
// migrations that block writes") lists each with CREATE INDEX
// CONCURRENTLY so an operator can build it first; the migration must then
// find it (IF NOT EXISTS) instead of failing on the name. An index a later
// migration drops, or one on a table its own migration creates, needs no
// entry.
func TestEveryBlockingIndexIsListedForOperators(t *testing.T) {
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	const heading = "**PostgreSQL migrations that block writes.**"
	_, listed, ok := strings.Cut(string(doc), heading)
	if !ok {
		t.Fatalf("OPERATIONS.md has no section %q", heading)
	}
	listed, _, _ = strings.Cut(listed, "\n```\n\n")

	create := regexp.MustCompile(`(?i)CREATE\s+(?:UNIQUE\s+)?INDEX\s+(IF\s+NOT\s+EXISTS\s+)?(\w+)\s+ON\s+(\w+)`)
	createTable := regexp.MustCompile(`(?i)CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)`)
	drop := regexp.MustCompile(`(?i)DROP\s+INDEX\s+(?:IF\s+EXISTS\s+)?(\w+)`)
	dropped := map[string]bool{}
	for _, m := range ms {
		for _, d := range drop.FindAllStringSubmatch(sqlWithoutComments(m.SQL), -1) {
			dropped[d[1]] = true
		}
	}
	for _, m := range ms[1:] {
		code := sqlWithoutComments(m.SQL)
		newTables := map[string]bool{}
		for _, c := range createTable.FindAllStringSubmatch(code, -1) {
			newTables[c[1]] = true
		}
		for _, c := range create.FindAllStringSubmatch(code, -1) {
			name, table := c[2], c[3]
			if newTables[table] {
				continue
			}
			if c[1] == "" {
				t.Errorf("migration %d: CREATE INDEX %s without IF NOT EXISTS fails when an operator built it beforehand", m.Version, name)
			}
			if dropped[name] {
				continue
			}
			if !regexp.MustCompile(`CREATE INDEX CONCURRENTLY IF NOT EXISTS ` + name + `\b`).MatchString(listed) {
				t.Errorf("migration %d builds %s, which OPERATIONS.md's %s does not list", m.Version, name, heading)
			}
		}
	}
}

// sqlWithoutComments drops "--" comments, which name indexes in prose.
func sqlWithoutComments(sql string) string {
	var b strings.Builder
	for line := range strings.Lines(sql) {
		code, _, _ := strings.Cut(line, "--")
		b.WriteString(code)
		b.WriteString("\n")
	}
	return b.String()
}
