package client

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
)

// PublishPolicyEditedFrom publishes an edit of the generation it names
// while that one is active; a lost answer is retried and replays (the
// same terms), and an edit of a stale copy is refused with
// ErrPolicyGenerationChanged and publishes nothing.
func TestPublishPolicyEditedFromRefusesAStaleCopy(t *testing.T) {
	l := startLedger(t)
	ctx := context.Background()
	first, _, err := l.direct.PublishPolicy(ctx, &ledgerv1.Policy{
		Subject: "tenant-e", Route: "chat.generate",
		Dimensions: []*ledgerv1.Dimension{{Unit: "tokens", Burst: 1_000}},
	})
	if err != nil {
		t.Fatal(err)
	}
	read, err := l.direct.GetPolicy(ctx, first.GetGeneration())
	if err != nil {
		t.Fatal(err)
	}
	edit := func(burst int64) *ledgerv1.Policy {
		p := proto.Clone(read).(*ledgerv1.Policy)
		p.Dimensions[0].Burst = burst
		return p
	}

	gw := l.viaProxy(t)
	l.proxy.DropNextResponses(1) // the edit is applied, its answer lost
	second, replayed, err := gw.PublishPolicyEditedFrom(ctx, edit(2_000), read.GetGeneration())
	if err != nil {
		t.Fatalf("an edit of the active generation %d whose answer was lost: %v", read.GetGeneration(), err)
	}
	if !replayed || second.GetGeneration() == read.GetGeneration() || second.GetDimensions()[0].GetBurst() != 2_000 {
		t.Fatalf("the retried edit answered generation %d (burst %d, replayed %v), want the new generation replayed",
			second.GetGeneration(), second.GetDimensions()[0].GetBurst(), replayed)
	}
	if got := l.proxy.Stats(); got.DroppedResponses != 1 {
		t.Fatalf("proxy stats %+v, want the one answer dropped", got)
	}

	_, _, err = gw.PublishPolicyEditedFrom(ctx, edit(3_000), read.GetGeneration())
	var le *LedgerError
	if !errors.Is(err, ErrPolicyGenerationChanged) || !errors.As(err, &le) || le.Reason != ReasonPolicyGenerationChanged {
		t.Fatalf("an edit of stale generation %d after %d was published: %v, want ErrPolicyGenerationChanged",
			read.GetGeneration(), second.GetGeneration(), err)
	}
	if _, err := l.direct.GetPolicy(ctx, second.GetGeneration()+1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("generation %d after the refused edit: %v, want none published", second.GetGeneration()+1, err)
	}
	if third, replayed, err := gw.PublishPolicyEditedFrom(ctx, edit(3_000), second.GetGeneration()); err != nil || replayed {
		t.Fatalf("an edit of the active generation %d: %v (replayed %v)", second.GetGeneration(), err, replayed)
	} else if third.GetDimensions()[0].GetBurst() != 3_000 {
		t.Fatalf("the edit published burst %d, want 3000", third.GetDimensions()[0].GetBurst())
	}
}
