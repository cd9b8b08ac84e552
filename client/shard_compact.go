package client

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/capledger/capledger/ledger"
)

// The shard log is compacted by dropping the records of ended shards: a
// shard is ended once it is sealed, the ledger accepted its first
// submission, no receipt it reported unknown is still unresolved
// centrally, and no submission is in flight. Nothing can change an ended
// shard any more and the ledger waits for nothing from it, so neither the
// store nor the ledger needs its records. The records of every other
// shard are kept as they are, in their order, so replaying the new log
// gives those shards exactly the state the old one did.
//
// What an ended shard leaves is written in their place, in ended
// records: its tombstones (per reservation its id, request digest and
// terminal state, about 130 bytes of log each), so that a retry of one of
// its ids is answered as before and never admitted again (its capacity
// was spent or reminted), and its id, so that the ledger's replay of its
// token is not installed again. They are kept until forgettable says so,
// then dropped by a later compaction. And each compaction writes the
// newest fence of every subject key the store ever held a shard for
// (about 100 bytes each), in fence records that replace the previous
// ones: the fence outlives the shards that carried it.

// ended reports whether st is an ended shard (see above).
func (st *storedShard) ended() bool {
	done, pending := st.local.Reconciled()
	return st.local.Sealed && done && pending == 0 && st.submitting == nil
}

// endedShard is a shard compacted out of the store: what its ended
// records keep of it.
type endedShard struct {
	id      string
	account ledger.AccountKey
	// endedAt is when it was compacted away (at or after it ended), from
	// which the tombstone retention counts; expiresAt its expiry.
	endedAt, expiresAt time.Time
	// ids are its reservations', each with a tombstone in
	// ShardStore.retired.
	ids []string
}

// forgettable reports whether the store may forget e at now: its
// tombstones were kept for the retention since it ended, and it has
// expired, so the ledger's replay of its token no longer verifies
// (ledger.ErrShardExpired) and is refused without it.
func (e *endedShard) forgettable(now time.Time, retention time.Duration) bool {
	return !now.Before(e.endedAt.Add(retention)) && !now.Before(e.expiresAt)
}

// shardTombstone is what is kept of a reservation of an ended shard.
type shardTombstone struct {
	shard  *endedShard
	digest string
	state  ledger.State
}

// tombstoneRecord is a shardTombstone in an ended record.
type tombstoneRecord struct {
	ID     string       `json:"id"`
	Digest string       `json:"digest,omitempty"`
	State  ledger.State `json:"state"`
}

// tombstonesPerRecord bounds an ended record (about 0.5 MB at this many;
// a shard with more tombstones has several).
const tombstonesPerRecord = 4096

// tombstoneKinds are the commands of the reservation records.
var tombstoneKinds = map[string]ledger.Kind{
	"reserve": ledger.KindReserve, "start": ledger.KindStart, "settle": ledger.KindSettle,
	"release": ledger.KindRelease, "unknown": ledger.KindMarkUsageUnknown,
}

// answer is a local op (a reservation record's name) of kind on id,
// answered from its tombstone as the ledger answers from its own
// (ledger.Tombstone.Answer): nothing changes, and a reserve with the
// request's digest replays.
func (t *shardTombstone) answer(id, op string, kind ledger.Kind, digest string) (*LocalReceipt, error) {
	tomb := ledger.Tombstone{ID: id, RequestDigest: t.digest, Account: t.shard.account, State: t.state}
	res := tomb.Answer(kind, digest)
	if res.Err != nil {
		return nil, fmt.Errorf("local %s %s: %w", op, id, res.Err)
	}
	return &LocalReceipt{ShardID: t.shard.id, ReservationID: id, RequestDigest: t.digest, State: t.state,
		Replayed: res.Replayed, Retired: true}, nil
}

// applyEnded replays an ended record: the shard's tombstones join those
// of its earlier ended records.
func (s *ShardStore) applyEnded(rec *shardRecord, at time.Time) error {
	if rec.Shard == "" || rec.Account == nil {
		return errors.New("ended record without its shard")
	}
	if _, held := s.shards[rec.Shard]; held {
		return fmt.Errorf("ended record of shard %s, which the log holds", rec.Shard)
	}
	e := s.ended[rec.Shard]
	if e == nil {
		e = &endedShard{id: rec.Shard, account: *rec.Account, endedAt: at, expiresAt: time.Unix(0, rec.Expires)}
		s.ended[rec.Shard] = e
	}
	for _, t := range rec.Tombstones {
		s.retired[t.ID] = &shardTombstone{shard: e, digest: t.Digest, state: t.State}
		e.ids = append(e.ids, t.ID)
	}
	return nil
}

// endedRecords are the ended records of held shard st, ended at now.
func endedRecords(shardID string, st *storedShard, now time.Time) []*shardRecord {
	sh := &st.local.Shard
	head := func() *shardRecord {
		account := sh.Account
		return &shardRecord{Op: "ended", At: now.UnixNano(), Shard: shardID, Account: &account, Expires: sh.ExpiresAt.UnixNano()}
	}
	out := []*shardRecord{head()}
	for _, r := range st.local.Reservations() {
		rec := out[len(out)-1]
		if len(rec.Tombstones) == tombstonesPerRecord {
			rec = head()
			out = append(out, rec)
		}
		rec.Tombstones = append(rec.Tombstones, tombstoneRecord{ID: r.ID, Digest: r.RequestDigest, State: r.State})
	}
	return out
}

// compactionPlan sorts the log for a compaction at now: drop are the
// shards whose records go (held shards that have ended, whose records
// give way to ended records, and ended shards that are forgettable),
// tail the ended and fence records to write after the records kept.
// dropped and kept are the bytes of log records of the shards dropped
// (with the boot records merged away) and of those kept (held and not
// ended, or ended and not forgettable), kept with the fence records of
// tail.
func (s *ShardStore) compactionPlan(now time.Time) (drop map[string]bool, tail []*shardRecord, dropped, kept int64) {
	drop = map[string]bool{}
	// Each open appends a boot record: counting those a compaction
	// merges away makes a store restarted over and over without a
	// shard ending compact too, so restarts do not grow the log.
	dropped = s.mergedBootBytes
	for _, id := range s.order {
		st := s.shards[id]
		if st.ended() {
			drop[id] = true
			dropped += s.logBytes[id]
			tail = append(tail, endedRecords(id, st, now)...)
		} else {
			kept += s.logBytes[id]
		}
	}
	for id, e := range s.ended {
		if e.forgettable(now, s.tombstoneRetention) {
			drop[id] = true
			dropped += s.logBytes[id]
		} else {
			kept += s.logBytes[id]
		}
	}
	keys := make([]ledger.PolicyKey, 0, len(s.newestFence))
	for key := range s.newestFence {
		keys = append(keys, key)
	}
	slices.SortFunc(keys, func(a, b ledger.PolicyKey) int { return strings.Compare(a.String(), b.String()) })
	for _, key := range keys {
		rec := &shardRecord{Op: "fence", At: now.UnixNano(),
			Account: &ledger.AccountKey{Subject: key.Subject, Route: key.Route, Region: key.Region}, Fence: s.newestFence[key]}
		tail = append(tail, rec)
		// The fence records are rewritten by every compaction: they
		// count as kept, so a rewrite is still paid for by as many
		// bytes dropped however many subject keys the store has held.
		if payload, err := json.Marshal(rec); err == nil {
			kept += int64(8 + len(payload))
		}
	}
	return drop, tail, dropped, kept
}

// maybeCompact compacts the log when the records a compaction drops
// (compactionPlan: the shards' and the boot records merged away) take at
// least compactAt bytes and more than those of the shards kept and the
// fence records, so the log stays under twice what the kept shards,
// tombstones and fences need plus compactAt (and one boot record per
// run the kept records leave between them), and each rewrite is paid
// for by at least as many bytes dropped. A compaction that fails before
// the new log replaces the old one leaves the store as it was (it is
// tried again at the next trigger); one that fails after breaks the
// store (s.broken), as a failed append does.
func (s *ShardStore) maybeCompact() {
	if s.broken != nil || s.compactAt < 0 {
		return
	}
	now := s.clock()
	drop, tail, dropped, kept := s.compactionPlan(now)
	if dropped < s.compactAt || dropped <= kept {
		return
	}
	_ = s.compact(drop, tail, now) // on failure the store goes on with the old log
}

// compact writes the log without the records of the shards of drop, and
// with tail after the rest, to a new file, syncs it, renames it over the
// log and syncs the directory (each sync through s.syncFile): a crash
// at any point leaves either the old log or the new one, whole (a new
// file left unrenamed is removed at open). Then it applies the same change in memory: the held shards
// dropped become ended ones (from their ended records in tail, as a
// replay would), the ended ones dropped are forgotten. The caller holds
// s.mu.
func (s *ShardStore) compact(drop map[string]bool, tail []*shardRecord, now time.Time) error {
	path := filepath.Join(s.dir, shardLogName)
	newPath := filepath.Join(s.dir, shardLogCompacting)
	kept, err := writeCompacted(path, newPath, drop, tail, s.syncFile)
	if err != nil {
		os.Remove(newPath)
		return err
	}
	if err := os.Rename(newPath, path); err != nil {
		os.Remove(newPath)
		return fmt.Errorf("compact shard log: %w", err)
	}
	// From here the old log is gone from the directory: appending to it
	// would be lost, so any failure breaks the store.
	if err := syncDir(s.dir, s.syncFile); err != nil {
		s.broken = fmt.Errorf("compact shard log: sync directory: %w", err)
		return s.broken
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0o600)
	if err == nil {
		_, err = f.Seek(0, io.SeekEnd)
		if err != nil {
			f.Close()
		}
	}
	if err != nil {
		s.broken = fmt.Errorf("compact shard log: reopen: %w", err)
		return s.broken
	}
	s.log.Close()
	s.log = f
	s.logBytes = kept
	// No two boot records follow each other in the new log. Whether it
	// ends with one is not tracked: the next boot record is not counted
	// as merged, one record less than it could.
	s.mergedBootBytes, s.lastIsBoot = 0, false
	for id := range drop {
		if e, ok := s.ended[id]; ok {
			for _, rid := range e.ids {
				delete(s.retired, rid)
			}
			delete(s.ended, id)
		}
	}
	for id := range drop {
		delete(s.shards, id)
	}
	order := s.order[:0]
	for _, id := range s.order {
		if !drop[id] {
			order = append(order, id)
		}
	}
	clear(s.order[len(order):])
	s.order = order
	for rid, id := range s.byReservation {
		if drop[id] {
			delete(s.byReservation, rid)
		}
	}
	for _, rec := range tail {
		if rec.Op == "ended" {
			if err := s.applyEnded(rec, now); err != nil {
				panic(fmt.Sprintf("compact shard log: %v", err)) // a held shard was dropped just above
			}
		}
	}
	return nil
}

// writeCompacted writes to newPath the records of the log at path that a
// replay needs once the shards of drop are dropped, then the records of
// tail, syncs it with sync and closes it, and returns the bytes each
// kept shard's records (its ended records too) take in it.
//
// Besides the kept shards' records: of each run of boot records with no
// kept record between them only the first is written (its time is when
// the run's first boot inherited the shards before it), carrying the
// run's last boot epoch; where a dropped shard's install sealed an
// older-fence kept shard of its subject, a seal of that shard at the same
// time takes its place; and the old fence records are left out (tail
// carries the newest fences).
func writeCompacted(path, newPath string, drop map[string]bool, tail []*shardRecord, sync func(*os.File) error) (map[string]int64, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("compact shard log: %w", err)
	}
	defer src.Close()
	info, err := src.Stat()
	if err != nil {
		return nil, fmt.Errorf("compact shard log: %w", err)
	}
	dst, err := os.OpenFile(newPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("compact shard log: %w", err)
	}
	defer dst.Close()
	w := bufio.NewWriter(dst)
	kept := map[string]int64{}
	write := func(shardID string, payload []byte) {
		var header [8]byte
		binary.BigEndian.PutUint32(header[:4], uint32(len(payload)))
		binary.BigEndian.PutUint32(header[4:], crc32.Checksum(payload, crcTable))
		w.Write(header[:])
		w.Write(payload)
		if shardID != "" {
			kept[shardID] += int64(len(header) + len(payload))
		}
	}
	var boot *shardRecord // the run of boot records not written yet
	flushBoot := func() error {
		if boot == nil {
			return nil
		}
		payload, err := json.Marshal(boot)
		if err != nil {
			return err
		}
		write("", payload)
		boot = nil
		return nil
	}
	type keptShard struct {
		id     string
		key    ledger.PolicyKey
		fence  uint64
		sealed bool // a seal was written for it in place of an ended install
	}
	var keptShards []*keptShard
	r := bufio.NewReader(src)
	for offset, size := int64(0), info.Size(); offset < size; {
		payload, n, err := readShardRecord(r, size-offset)
		if err != nil {
			// The log was read whole at open and every append since
			// was synced: a record that does not read now is damage.
			return nil, fmt.Errorf("compact shard log: %w at offset %d: %v", ErrShardStoreCorrupt, offset, err)
		}
		offset += n
		var rec shardRecord
		if err := json.Unmarshal(payload, &rec); err != nil {
			return nil, fmt.Errorf("compact shard log: %w: %v", ErrShardStoreCorrupt, err)
		}
		switch {
		case rec.Op == "boot":
			if boot == nil {
				boot = &rec
			} else {
				boot.Boot = rec.Boot
			}
		case rec.Op == "fence":
		case drop[rec.Shard]:
			if rec.Op != "install" {
				continue
			}
			sh, err := ledger.DecodeShardToken(rec.Token)
			if err != nil {
				return nil, fmt.Errorf("compact shard log: %w: %v", ErrShardStoreCorrupt, err)
			}
			for _, k := range keptShards {
				if k.key == sh.Account.SubjectKey() && k.fence < sh.Fence && !k.sealed {
					if err := flushBoot(); err != nil {
						return nil, err
					}
					seal, err := json.Marshal(&shardRecord{Op: "seal", At: rec.At, Shard: k.id})
					if err != nil {
						return nil, err
					}
					write(k.id, seal)
					k.sealed = true
				}
			}
		default:
			if err := flushBoot(); err != nil {
				return nil, err
			}
			write(rec.Shard, payload)
			if rec.Op == "install" {
				sh, err := ledger.DecodeShardToken(rec.Token)
				if err != nil {
					return nil, fmt.Errorf("compact shard log: %w: %v", ErrShardStoreCorrupt, err)
				}
				keptShards = append(keptShards, &keptShard{id: rec.Shard, key: sh.Account.SubjectKey(), fence: sh.Fence})
			}
		}
	}
	if err := flushBoot(); err != nil {
		return nil, err
	}
	for _, rec := range tail {
		payload, err := json.Marshal(rec)
		if err != nil {
			return nil, err
		}
		write(rec.Shard, payload)
	}
	if err := w.Flush(); err != nil {
		return nil, fmt.Errorf("compact shard log: %w", err)
	}
	if err := sync(dst); err != nil {
		return nil, fmt.Errorf("compact shard log: %w", err)
	}
	if err := dst.Close(); err != nil {
		return nil, fmt.Errorf("compact shard log: %w", err)
	}
	return kept, nil
}

// syncDir fsyncs a directory with sync, making a rename in it durable.
func syncDir(dir string, sync func(*os.File) error) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return sync(d)
}
