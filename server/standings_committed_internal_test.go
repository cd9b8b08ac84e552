package server

import (
	"testing"
	"time"
)

// Two publishes (or rollbacks) answering at once note their commits in
// either order: the later commit's time stays the one a reusable ranking
// must have begun at or after. Were the earlier one's note to overwrite
// it, a ranking whose scan began between the two notes, before the later
// commit, would be given again after the later publish answered, with the
// marks from before it.
func TestStandingsNotBeforeKeepsTheLaterOfTwoCommits(t *testing.T) {
	s := &Server{}
	earlier := time.Now()
	later := earlier.Add(time.Millisecond)
	s.noteCommit(later)
	s.noteCommit(earlier) // the earlier publish's handler got here last
	if got := s.sharedNotBefore(); !got.Equal(later) {
		t.Fatalf("sharedNotBefore %v after notes of %v then %v: want the later, %v", got, later, earlier, later)
	}
	s.noteCommit(later.Add(time.Millisecond))
	if got := s.sharedNotBefore(); !got.Equal(later.Add(time.Millisecond)) {
		t.Fatalf("sharedNotBefore %v: want the newest note, %v", got, later.Add(time.Millisecond))
	}
}
