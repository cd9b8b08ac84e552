package doclinks

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"unicode"
)

var (
	// markdownLink matches the target of an inline link or image,
	// [text](target) or ![alt](target), on one line.
	markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading      = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	htmlAnchor   = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	inlineCode   = regexp.MustCompile("`[^`]*`")
)

// TestRelativeLinksResolve reads every Markdown file of the module and
// checks each relative link: the file or directory it names exists, and
// an #anchor names a heading of the target page (GitHub's slug of it) or
// an explicit <a name> there. Links in fenced code blocks and inline code
// are not links; absolute URLs are not checked (no network in tests).
func TestRelativeLinksResolve(t *testing.T) {
	root := moduleRoot(t)
	pages := markdownFiles(t, root)
	if len(pages) < 10 {
		t.Fatalf("found %d Markdown files under %s; the walk is broken", len(pages), root)
	}
	anchorsOf := map[string]map[string]bool{}
	checked := 0
	for _, page := range pages {
		for _, l := range linksOf(t, page) {
			checked++
			target, fragment, _ := strings.Cut(l.target, "#")
			resolved := page
			if target != "" {
				resolved = filepath.Join(filepath.Dir(page), filepath.FromSlash(target))
			}
			rel, _ := filepath.Rel(root, page)
			if _, err := os.Stat(resolved); err != nil {
				t.Errorf("%s:%d: link %q: %s does not exist", rel, l.line, l.target, target)
				continue
			}
			if fragment == "" || !strings.HasSuffix(resolved, ".md") {
				continue
			}
			anchors, ok := anchorsOf[resolved]
			if !ok {
				anchors = anchorsIn(t, resolved)
				anchorsOf[resolved] = anchors
			}
			if !anchors[fragment] {
				t.Errorf("%s:%d: link %q: no heading of %s has the anchor #%s", rel, l.line, l.target, filepath.Base(resolved), fragment)
			}
		}
	}
	if checked < 100 {
		t.Fatalf("checked only %d links; the link pattern is broken", checked)
	}
}

// TestSlugMatchesGitHub pins the heading-to-anchor rule on headings the
// docs link to, so a change to slug cannot make every anchor "resolve".
func TestSlugMatchesGitHub(t *testing.T) {
	for heading, want := range map[string]string{
		"The `capledger` command":          "the-capledger-command",
		"6. Roll back, and watch it drain": "6-roll-back-and-watch-it-drain",
		"`/readyz` answers 503":            "readyz-answers-503",
		"What `serve` checks":              "what-serve-checks",
		"For gateway authors (Go SDK)":     "for-gateway-authors-go-sdk",
		"USAGE_UNKNOWN backlog":            "usage_unknown-backlog",
		"Audit (admin)":                    "audit-admin",
		"3. The request digest":            "3-the-request-digest",
		"RolloutService (rollouts, shadow comparison, rollback drains, legacy budget)": "rolloutservice-rollouts-shadow-comparison-rollback-drains-legacy-budget",
	} {
		if got := slug(heading); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}
}

type link struct {
	target string
	line   int
}

// linksOf returns the relative link targets of one Markdown file, outside
// fenced code blocks and inline code.
func linksOf(t *testing.T, page string) []link {
	t.Helper()
	var links []link
	for i, line := range proseLines(t, page) {
		if line == "" {
			continue
		}
		for _, m := range markdownLink.FindAllStringSubmatch(inlineCode.ReplaceAllString(line, ""), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links = append(links, link{target: target, line: i + 1})
		}
	}
	return links
}

// anchorsIn returns the anchors GitHub gives the headings of a Markdown
// file (a repeated heading gets -1, -2, ...), plus explicit <a name="...">.
func anchorsIn(t *testing.T, page string) map[string]bool {
	t.Helper()
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, line := range proseLines(t, page) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			anchors[m[1]] = true
		}
		m := heading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := slug(m[1])
		if n := seen[s]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			anchors[s] = true
		}
		seen[s]++
	}
	return anchors
}

// slug is GitHub's anchor for a heading: lower case, every character that
// is not a letter, digit, space, hyphen or underscore dropped (so the
// backquotes of code spans go, their text stays), spaces made hyphens.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// proseLines returns the lines of a Markdown file with those inside
// fenced code blocks blanked, so line numbers stay those of the file.
func proseLines(t *testing.T, page string) []string {
	t.Helper()
	data, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	inFence := false
	for i, line := range lines {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			lines[i] = ""
			continue
		}
		if inFence {
			lines[i] = ""
		}
	}
	return lines
}

func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var pages []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			pages = append(pages, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pages
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(here), "..", "..")
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s: %v", root, err)
	}
	return root
}
