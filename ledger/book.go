package ledger

// Book is what commands read and write: one consistent view of the ledger's
// rows, for the duration of one command (or one batch of commands).
//
// The ledger decides; the Book only stores. Getters return the Book's own
// copy, which a command may change in place and then hands back with the
// matching Put; a Book that fails to read a row (an I/O error in a store
// transaction) reports it as absent, remembers the error and lets its owner
// discard the whole batch, so a command never needs to handle I/O errors.
type Book interface {
	// Meta returns a named counter (0 when never set).
	Meta(name string) int64
	MetaPut(name string, value int64)

	Policy(generation uint64) (*Policy, bool)
	PolicyPut(p *Policy)
	PolicyHead(key PolicyKey) (*PolicyHead, bool)
	PolicyHeadPut(h *PolicyHead)

	Account(key AccountKey) (*Account, bool)
	AccountPut(a *Account)
	// AccountCurrent returns the generation whose account currently holds the
	// subject's capacity (the subject key is concrete, never AnySubject).
	AccountCurrent(subject PolicyKey) (generation uint64, ok bool)
	AccountCurrentPut(subject PolicyKey, generation uint64)

	Reservation(id string) (*Reservation, bool)
	ReservationPut(r *Reservation)

	Move(receiptID string) (*Move, bool)
	MovePut(m *Move)

	Shard(id string) (*Shard, bool)
	ShardPut(s *Shard)

	StatementPut(s Statement)
	JournalAppend(e JournalEntry)
}

// Meta counter names.
const (
	// MetaGeneration is the last policy generation handed out; generations
	// are unique across every policy key.
	MetaGeneration = "policy_generation"
	// MetaPolicyChanges counts the policy changes committed: a publish
	// of a new generation and a rollback each add one, in their own
	// transaction (a rollback changes its policy row in place, which
	// MetaGeneration does not show). A reader that keeps what it derived
	// from the policies reads them again only once it moved
	// (store.Store.PolicyChanges).
	MetaPolicyChanges = "policy_changes"
)

// ReservationRows is an optional Book extension for a book that keeps many
// reservations in memory: NewReservation hands out a zeroed row that the
// book will own once it is put, so the book may carve rows from slabs
// rather than pay one heap allocation (and its share of garbage collection)
// for each.
type ReservationRows interface {
	NewReservation() *Reservation
}

// newReservation is a zeroed reservation row for book b.
func newReservation(b Book) *Reservation {
	if rows, ok := b.(ReservationRows); ok {
		return rows.NewReservation()
	}
	return new(Reservation)
}
