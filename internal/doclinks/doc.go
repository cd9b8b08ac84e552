// Package doclinks holds only a test: every relative link and #anchor in
// the repository's Markdown files (README.md, docs/, examples/) must
// resolve, because the docs are a contract readers follow from page to
// page, and a renamed heading or moved file breaks them silently.
package doclinks
