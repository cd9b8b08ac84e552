package main

import (
	"context"
	"flag"
)

// pageFlags are the paging flags of the admin list commands (backlog,
// debts).
type pageFlags struct {
	limit int
	token string
	all   bool
}

const pageFlagsHelp = `  --limit N          entries per page (default 100, at most 1000)
  --page-token T     the nextPageToken of the previous page
  --all              follow every page and print them as one list
`

func (p *pageFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&p.limit, "limit", 100, "")
	fs.StringVar(&p.token, "page-token", "", "")
	fs.BoolVar(&p.all, "all", false, "")
}

// check refuses flag combinations the server would refuse or that
// contradict each other.
func (p *pageFlags) check() error {
	if p.limit < 1 || p.limit > 1000 {
		return intIn("limit", p.limit, 1, 1000)
	}
	if p.all && p.token != "" {
		return usagef("--all starts at the first page; leave out --page-token")
	}
	return nil
}

// paged is a list method's answer.
type paged interface{ GetNextPageToken() string }

// listPages asks list for the page at --page-token, and with --all for
// every page after it, merging each into the answer so far with merge
// (which keeps the later page's other fields: they are the most recent).
func listPages[Res paged](ctx context.Context, p *pageFlags, list func(ctx context.Context, token string) (Res, error), merge func(sofar, next Res) Res) (Res, error) {
	msg, err := list(ctx, p.token)
	for err == nil && p.all && msg.GetNextPageToken() != "" {
		var next Res
		if next, err = list(ctx, msg.GetNextPageToken()); err == nil {
			msg = merge(msg, next)
		}
	}
	return msg, err
}
