package main

import (
	"strconv"
	"unicode"
)

// cell returns a name (subject, route, region, id, rollout name) as a
// line of a text table or message may hold it: as it is when every rune
// is printable, else quoted with Go's escapes ("tenant\n7"), so that a
// line end, tab or other control character the API accepts cannot split
// a row or shift its columns. JSON output needs none of this: it escapes.
func cell(name string) string {
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return strconv.Quote(name)
		}
	}
	return name
}

// keyCell is subject/route@region, each part as cell shows it.
func keyCell(subject, route, region string) string {
	return cell(subject) + "/" + cell(route) + "@" + cell(region)
}

// routeCell is route@region, each part as cell shows it.
func routeCell(route, region string) string {
	return cell(route) + "@" + cell(region)
}
