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
	"sync"
	"syscall"
	"time"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/ledger"
)

// ShardStore is a gateway's durable store of emergency shards: the shards
// it was issued (as signed tokens) and every local reservation it made
// from them, kept in an append-only log in one directory, fsync'ed per
// record before the operation returns. The log is compacted: once a
// shard has ended (reported and fully resolved), its records are dropped
// in a crash-safe rewrite when ended shards' records outweigh the rest
// (see maybeCompact), and the shard leaves the store; its reservations'
// tombstones stay for ShardStoreOptions.TombstoneRetention, so a retried
// id is answered as the ledger answers from its own tombstones, never
// admitted again, and the newest fence of every subject key stays for
// good (see shard_compact.go). Each shard's local ledger
// (ledger.ShardLocal) keeps allocated = available + reserved + spent +
// retired after every operation.
//
// Opening the store starts a new boot epoch of the gateway (greater than
// every earlier one in the log, and at least the clock in milliseconds):
// shards of earlier boots are inherited, never spent
// again (their unstarted holds released, their started work USAGE_UNKNOWN),
// but their receipts are still reported at reconciliation. Only shards
// issued to this boot, unexpired and not fenced by a newer one for the
// same subject, admit. Each open logs a boot record; a compaction merges
// boot records with nothing between them, and counts them toward its
// trigger, so restarts do not grow the log without bound.
//
// The directory belongs to one gateway identity and one process at a
// time (an exclusive lock file guards it). A ShardStore is safe for
// concurrent use.
type ShardStore struct {
	dir       string
	gatewayID string
	keys      ledger.ShardKeys
	clock     func() time.Time

	mu     sync.Mutex
	lock   *os.File
	log    *os.File
	boot   uint64
	broken error
	shards map[string]*storedShard
	order  []string
	// byReservation maps a local reservation id to its shard.
	byReservation map[string]string
	// newestFence is the newest fence installed per subject key, kept
	// for every subject key the store ever held a shard for (compaction
	// writes it as fence records), so a reopen still refuses an older
	// fence after the shard that carried the newest one is gone.
	newestFence map[ledger.PolicyKey]uint64
	// logBytes is how many bytes of the log each shard's records take.
	logBytes map[string]int64
	// mergedBootBytes is how many bytes of the log the boot records a
	// compaction merges away take: each that directly follows another
	// boot record (one per open of a store nothing happened in since).
	// lastIsBoot: the log's last record is a boot record.
	mergedBootBytes int64
	lastIsBoot      bool
	// compactAt is the least number of bytes of ended shards' records
	// and merged boot records the log is compacted for
	// (shardLogCompactAt; tests lower it).
	compactAt int64
	// syncFile makes every sync the store does, of the log, of a
	// compaction's new log and of the directory (ShardStoreOptions.syncFile).
	syncFile func(f *os.File) error
	// ended are the shards compacted away, as their tombstones, until
	// they may be forgotten (endedShard.forgettable); retired maps each
	// of their reservation ids to its tombstone. Both are replayed from
	// the log's ended records, so they hold across reopens.
	ended   map[string]*endedShard
	retired map[string]*shardTombstone
	// tombstoneRetention is how long an ended shard's tombstones are
	// kept at least (ShardStoreOptions.TombstoneRetention).
	tombstoneRetention time.Duration
}

// storedShard is one shard of the store.
type storedShard struct {
	local *ledger.ShardLocal
	token []byte
	units []string
	// submitting is the submission in flight (logged before it was sent),
	// nil when none.
	submitting []ledger.ShardReceipt
}

// Errors of the shard store besides the ledger's shard and reservation
// errors (which it returns wrapped, so errors.Is works on them).
var (
	// ErrNoShard: no live shard of this boot covers the subject, route and
	// region.
	ErrNoShard = errors.New("no live emergency shard")
	// ErrShardStoreBroken: a log write failed; the store refuses every
	// operation until it is reopened (which replays what reached the disk).
	ErrShardStoreBroken = errors.New("shard store broken")
	// ErrShardStoreLocked: another process holds the directory.
	ErrShardStoreLocked = errors.New("shard store in use by another process")
	// ErrShardStoreCorrupt: a log record in the middle of the log does not
	// verify, or zeros stand where a record should be with data after
	// them. A torn last record, and zeros from a record boundary to the
	// end of the file (a write whose bytes never reached the disk), are
	// dropped silently: that write was never acknowledged.
	ErrShardStoreCorrupt = errors.New("shard store log corrupt")
	// ErrShardStoreIdentity: the directory belongs to another gateway
	// identity (ShardStoreOptions.GatewayID differs from the one its log
	// was written under). Nothing is damaged: open it with its own gateway
	// id, or give this gateway a directory of its own.
	ErrShardStoreIdentity = errors.New("shard store belongs to another gateway (identity mismatch, not corruption)")
)

const shardLogName = "shards.log"

// shardLogCompacting is the new log while a compaction writes it; it only
// replaces shards.log once complete and synced, so one left at open is an
// interrupted compaction and is removed.
const shardLogCompacting = "shards.log.compacting"

// shardLogCompactAt is the least number of bytes of ended shards'
// records and boot records to merge that makes a compaction worth its
// rewrite (it also needs them to outweigh the records of the shards
// still kept).
const shardLogCompactAt = 256 << 10

// shardRecord is one log record. Op is one of boot, install, reserve,
// start, settle, release, unknown, seal, submitting, submitted; and,
// written only by a compaction, ended (an ended shard's tombstones) and
// fence (the newest fence of a subject key).
type shardRecord struct {
	Op        string                `json:"op"`
	At        int64                 `json:"at"`
	Boot      uint64                `json:"boot,omitempty"`
	Gateway   string                `json:"gateway,omitempty"`
	Shard     string                `json:"shard,omitempty"`
	Token     []byte                `json:"token,omitempty"`
	Units     []string              `json:"units,omitempty"`
	ID        string                `json:"id,omitempty"`
	Digest    string                `json:"digest,omitempty"`
	Operation string                `json:"operation,omitempty"`
	Amounts   ledger.Amounts        `json:"amounts,omitzero"`
	Receipts  []ledger.ShardReceipt `json:"receipts,omitempty"`
	// Account is an ended shard's account, or a fence record's subject
	// key (its generation 0); Fence the fence of a fence record; Expires
	// an ended shard's expiry (Unix nanoseconds); Tombstones its
	// reservations.
	Account    *ledger.AccountKey `json:"account,omitempty"`
	Fence      uint64             `json:"fence,omitempty"`
	Expires    int64              `json:"expires,omitempty"`
	Tombstones []tombstoneRecord  `json:"tombstones,omitempty"`
}

// ShardStoreOptions configure OpenShardStore.
type ShardStoreOptions struct {
	// GatewayID is the gateway identity shards are issued to; required,
	// and the same on every open of the directory.
	GatewayID string
	// Keys verify shards at Install when Install is given none.
	Keys ledger.ShardKeys
	// Clock returns the time of operations (default time.Now).
	Clock func() time.Time
	// TombstoneRetention is how long, at least, the store answers for
	// the reservation ids of a shard after the shard ended and was
	// compacted away (default DefaultShardTombstoneRetention, the
	// ledger's default `serve --tombstone-retention`; set it to the
	// ledger's). Within it a retried id is answered from its tombstone,
	// never admitted again; after it the id is unknown, as at the
	// ledger after its tombstone horizon. Judged by Clock, from the
	// compaction that made the tombstones: a clock that jumps ahead by
	// more than it lets them be forgotten early.
	TombstoneRetention time.Duration
	// compactAt overrides shardLogCompactAt (tests); negative: never.
	compactAt int64
	// syncFile, if set, is called in place of every Sync the store makes:
	// of the log, of a compaction's new log, of the directory (tests
	// observe the syncs with it; it must call f.Sync).
	syncFile func(f *os.File) error
}

// DefaultShardTombstoneRetention is ShardStoreOptions.TombstoneRetention's
// default: 30 days, as the ledger's `serve --tombstone-retention`.
const DefaultShardTombstoneRetention = 720 * time.Hour

// OpenShardStore opens (creating if needed) the store in dir, replays its
// log and starts a new boot epoch. It returns an error wrapping
// ErrShardStoreLocked when another process has the directory open,
// ErrShardStoreIdentity when the directory was written under another
// gateway id, ErrShardStoreCorrupt for a damaged log, or an I/O error.
func OpenShardStore(dir string, opts ShardStoreOptions) (*ShardStore, error) {
	if opts.GatewayID == "" {
		return nil, errors.New("open shard store: a gateway id is required")
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.TombstoneRetention < 0 {
		return nil, errors.New("open shard store: the tombstone retention is negative")
	}
	if opts.TombstoneRetention == 0 {
		opts.TombstoneRetention = DefaultShardTombstoneRetention
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open shard store: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open shard store: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("open shard store %s: %w: %v", dir, ErrShardStoreLocked, err)
	}
	s := &ShardStore{
		dir: dir, gatewayID: opts.GatewayID, keys: opts.Keys, clock: opts.Clock, lock: lock,
		shards: map[string]*storedShard{}, byReservation: map[string]string{}, newestFence: map[ledger.PolicyKey]uint64{},
		logBytes: map[string]int64{}, compactAt: shardLogCompactAt,
		ended: map[string]*endedShard{}, retired: map[string]*shardTombstone{}, tombstoneRetention: opts.TombstoneRetention,
	}
	if opts.compactAt != 0 {
		s.compactAt = opts.compactAt
	}
	s.syncFile = (*os.File).Sync
	if opts.syncFile != nil {
		s.syncFile = opts.syncFile
	}
	// A compaction cut short (by a crash) left the old log whole: it is
	// the store; the unfinished new one is dropped.
	if err := os.Remove(filepath.Join(dir, shardLogCompacting)); err != nil && !errors.Is(err, os.ErrNotExist) {
		lock.Close()
		return nil, fmt.Errorf("open shard store: %w", err)
	}
	if err := s.replay(); err != nil {
		lock.Close()
		return nil, err
	}
	s.maybeCompact()
	if s.broken != nil {
		err := s.broken
		s.Close()
		return nil, fmt.Errorf("open shard store: %w: %v", ErrShardStoreBroken, err)
	}
	// The boot epoch grows by one per open, and is at least the clock in
	// milliseconds: a gateway whose directory was lost still never reuses
	// the boot epoch of a process that ran before.
	s.boot = max(s.boot+1, uint64(max(s.clock().UnixMilli(), 0)))
	if err := s.append(&shardRecord{Op: "boot", At: s.clock().UnixNano(), Boot: s.boot, Gateway: s.gatewayID}); err != nil {
		s.Close()
		return nil, fmt.Errorf("open shard store: %w", err)
	}
	s.inherit(s.clock())
	return s, nil
}

// replay reads the log, applying every record, and truncates a torn tail.
func (s *ShardStore) replay() error {
	path := filepath.Join(s.dir, shardLogName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open shard store: %w", err)
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("open shard store: %w", err)
	}
	size := info.Size()
	r := bufio.NewReader(f)
	var offset int64
	for offset < size {
		payload, n, err := readShardRecord(r, size-offset)
		if err != nil && !errors.Is(err, errTornRecord) {
			zero, zerr := zeroTail(f, offset, size)
			if zerr != nil {
				f.Close()
				return fmt.Errorf("open shard store: %w", zerr)
			}
			if zero {
				// The file grew over the last write but its bytes never
				// reached the disk (ext4 data=writeback, XFS): a write
				// the crash cut short, never acknowledged, since every
				// acknowledged record was synced whole.
				err = errTornRecord
			}
		}
		if errors.Is(err, errTornRecord) {
			// The last write did not complete, so it was never
			// acknowledged: drop it, durably before anything is
			// appended, so that no crash brings the torn bytes back in
			// front of a later record (which would then be unreadable).
			if err := f.Truncate(offset); err != nil {
				f.Close()
				return fmt.Errorf("open shard store: truncate torn record: %w", err)
			}
			if err := s.syncFile(f); err != nil {
				f.Close()
				return fmt.Errorf("open shard store: sync truncated log: %w", err)
			}
			break
		}
		if err != nil {
			f.Close()
			return fmt.Errorf("open shard store: %w at offset %d: %v", ErrShardStoreCorrupt, offset, err)
		}
		var rec shardRecord
		if err := json.Unmarshal(payload, &rec); err != nil {
			f.Close()
			return fmt.Errorf("open shard store: %w at offset %d: %v", ErrShardStoreCorrupt, offset, err)
		}
		if err := s.apply(&rec); err != nil {
			f.Close()
			if errors.Is(err, ErrShardStoreIdentity) {
				return fmt.Errorf("open shard store %s: %w", s.dir, err)
			}
			return fmt.Errorf("open shard store: %w at offset %d: %v", ErrShardStoreCorrupt, offset, err)
		}
		s.count(&rec, n)
		offset += n
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		f.Close()
		return fmt.Errorf("open shard store: %w", err)
	}
	s.log = f
	return nil
}

var errTornRecord = errors.New("torn record")

// zeroTail reports whether the bytes of f from offset to size are all
// zero. It reads with ReadAt, leaving f's offset alone.
func zeroTail(f *os.File, offset, size int64) (bool, error) {
	buf := make([]byte, 64<<10)
	for offset < size {
		n, err := f.ReadAt(buf[:min(int64(len(buf)), size-offset)], offset)
		for _, b := range buf[:n] {
			if b != 0 {
				return false, nil
			}
		}
		offset += int64(n)
		if err != nil && offset < size {
			return false, err
		}
	}
	return true, nil
}

// readShardRecord reads one record (4-byte length, 4-byte CRC-32C, JSON
// payload) of at most left bytes. A record cut short by the end of the file
// is errTornRecord; a checksum mismatch is errTornRecord when the record is
// the last one in the file and corruption otherwise; so is a zero length
// (replay tells zeros up to the end of the file, a write whose bytes never
// reached the disk, from zeros in the middle).
func readShardRecord(r *bufio.Reader, left int64) ([]byte, int64, error) {
	var header [8]byte
	if left < 8 {
		return nil, 0, errTornRecord
	}
	if _, err := io.ReadFull(r, header[:]); err != nil {
		return nil, 0, errTornRecord
	}
	n := int64(binary.BigEndian.Uint32(header[:4]))
	if n > left-8 {
		return nil, 0, errTornRecord
	}
	if n > 64<<20 {
		return nil, 0, fmt.Errorf("record of %d bytes", n)
	}
	if n == 0 {
		// No record is empty (each is a JSON object), and zeros pass the
		// checksum: a zero header is zeros where a record should be.
		return nil, 0, errors.New("zero bytes where a record should begin (data follows them, so this is damage, not a torn tail)")
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return nil, 0, errTornRecord
	}
	if crc32.Checksum(payload, crcTable) != binary.BigEndian.Uint32(header[4:]) {
		if n == left-8 {
			return nil, 0, errTornRecord
		}
		return nil, 0, errors.New("checksum mismatch")
	}
	return payload, 8 + n, nil
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// append writes one record and fsyncs it. A failure breaks the store: the
// in-memory state may be ahead of the disk, so nothing more is accepted.
func (s *ShardStore) append(rec *shardRecord) error {
	payload, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	buf := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint32(buf[:4], uint32(len(payload)))
	binary.BigEndian.PutUint32(buf[4:], crc32.Checksum(payload, crcTable))
	buf = append(buf, payload...)
	if _, err := s.log.Write(buf); err != nil {
		s.broken = err
		return fmt.Errorf("%w: %v", ErrShardStoreBroken, err)
	}
	if err := s.syncFile(s.log); err != nil {
		s.broken = err
		return fmt.Errorf("%w: %v", ErrShardStoreBroken, err)
	}
	s.count(rec, int64(len(buf)))
	return nil
}

// count accounts for a record of n bytes in the log, for compaction.
func (s *ShardStore) count(rec *shardRecord, n int64) {
	if rec.Shard != "" {
		s.logBytes[rec.Shard] += n
	}
	if rec.Op == "boot" && s.lastIsBoot {
		s.mergedBootBytes += n
	}
	s.lastIsBoot = rec.Op == "boot"
}

// apply replays one record. Every logged operation succeeded when it was
// logged and the local ledger is deterministic, so it succeeds again; an
// error means the log does not describe a history this code produced.
func (s *ShardStore) apply(rec *shardRecord) error {
	at := time.Unix(0, rec.At)
	switch rec.Op {
	case "boot":
		if rec.Gateway != s.gatewayID {
			return fmt.Errorf("%w: the log belongs to gateway %q, not %q", ErrShardStoreIdentity, rec.Gateway, s.gatewayID)
		}
		s.boot = rec.Boot
		s.inherit(at)
		return nil
	case "install":
		sh, err := ledger.DecodeShardToken(rec.Token)
		if err != nil {
			return err
		}
		s.install(sh, rec.Token, rec.Units, at)
		return nil
	case "seal":
		st, ok := s.shards[rec.Shard]
		if !ok {
			return fmt.Errorf("seal of unknown shard %s", rec.Shard)
		}
		st.local.Seal(at)
		return nil
	case "ended":
		return s.applyEnded(rec, at)
	case "fence":
		if rec.Account == nil {
			return errors.New("fence record without a subject key")
		}
		s.raiseFence(rec.Account.SubjectKey(), rec.Fence)
		return nil
	case "submitting", "submitted":
		st, ok := s.shards[rec.Shard]
		if !ok {
			return fmt.Errorf("%s of unknown shard %s", rec.Op, rec.Shard)
		}
		if rec.Op == "submitting" {
			st.submitting = rec.Receipts
		} else {
			st.local.Submitted(rec.Receipts)
			st.submitting = nil
		}
		return nil
	}
	res := s.applyReservation(rec, at, true)
	return res.Err
}

// applyReservation runs a reservation record against its shard's ledger.
// A replayed reserve (replay, from the log) is loaded without the id rule
// a new one is checked by: the log may have been written by an older SDK
// under a looser rule, and what the store admitted once is history that
// must load, or the gateway cannot open its store after an upgrade.
func (s *ShardStore) applyReservation(rec *shardRecord, at time.Time, replay bool) ledger.Result {
	shardID := rec.Shard
	if shardID == "" {
		shardID = s.byReservation[rec.ID]
	}
	st, ok := s.shards[shardID]
	if !ok {
		return ledger.Result{Err: fmt.Errorf("%w: %s", ledger.ErrReservationNotFound, rec.ID)}
	}
	var res ledger.Result
	switch rec.Op {
	case "reserve":
		if replay {
			res = st.local.ReplayReserve(rec.ID, rec.Digest, rec.Amounts, at)
		} else {
			res = st.local.Reserve(rec.ID, rec.Digest, rec.Amounts, at)
		}
		if res.Err == nil {
			s.byReservation[rec.ID] = shardID
		}
	case "start":
		res = st.local.Start(rec.ID, rec.Operation, at)
	case "settle":
		res = st.local.Settle(rec.ID, rec.Operation, rec.Amounts, at)
	case "release":
		res = st.local.Release(rec.ID, at)
	case "unknown":
		res = st.local.MarkUsageUnknown(rec.ID, at)
	default:
		res = ledger.Result{Err: fmt.Errorf("unknown record %q", rec.Op)}
	}
	return res
}

func (s *ShardStore) install(sh *ledger.Shard, token []byte, units []string, at time.Time) {
	key := sh.Account.SubjectKey()
	// A newer fence for the same subject kills the older shards.
	for _, id := range s.order {
		other := s.shards[id]
		if other.local.Shard.Account.SubjectKey() == key && other.local.Shard.Fence < sh.Fence {
			other.local.Seal(at)
		}
	}
	local := ledger.NewShardLocal(sh)
	local.Units = slices.Clone(units)
	s.shards[sh.ID] = &storedShard{local: local, token: slices.Clone(token), units: slices.Clone(units)}
	s.order = append(s.order, sh.ID)
	s.raiseFence(key, sh.Fence)
}

// raiseFence records fence as key's newest if it is newer.
func (s *ShardStore) raiseFence(key ledger.PolicyKey, fence uint64) {
	if fence > s.newestFence[key] {
		s.newestFence[key] = fence
	}
}

// inherit seals every shard of an earlier boot: a restarted process never
// spends its predecessor's capacity.
func (s *ShardStore) inherit(at time.Time) {
	for _, id := range s.order {
		st := s.shards[id]
		if st.local.Shard.BootEpoch < s.boot && !st.local.Sealed {
			st.local.Inherit(at)
		}
	}
}

// Close releases the directory. The store must not be used afterwards.
func (s *ShardStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	if s.log != nil {
		err = s.log.Close()
		s.log = nil
	}
	if s.lock != nil {
		s.lock.Close()
		s.lock = nil
	}
	if s.broken == nil {
		s.broken = errors.New("closed")
	}
	return err
}

// BootEpoch returns this process's boot epoch: what shards are issued to.
func (s *ShardStore) BootEpoch() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.boot
}

// GatewayID returns the gateway identity of the store.
func (s *ShardStore) GatewayID() string { return s.gatewayID }

// Install verifies a shard token (signature, this gateway and boot epoch,
// not expired, fence not older than the newest held for its subject) and
// keeps it; units are the names of its amounts' positions, keys verify it
// (nil: the store's ShardStoreOptions.Keys). A newer fence seals the older
// shards of the same subject.
//
// Returns the shard; an error wrapping the ledger's verification error
// (ErrShardSignature, ErrShardUnknownKey, ErrShardForeign,
// ErrShardBootEpoch, ErrShardFenced, ErrShardExpired), ErrShardMalformed,
// ledger.ErrShardIDReused when the shard id is already installed (or was,
// and has ended and been compacted away, while its tombstones are kept:
// until its expiry at least, after which its token no longer verifies),
// or a log write error.
func (s *ShardStore) Install(token []byte, units []string, keys ledger.ShardKeys) (*ledger.Shard, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken != nil {
		return nil, fmt.Errorf("install shard: %w: %v", ErrShardStoreBroken, s.broken)
	}
	sh, err := ledger.DecodeShardToken(token)
	if err != nil {
		return nil, fmt.Errorf("install shard: %w", err)
	}
	if len(units) == 0 || len(units) > ledger.MaxDimensions {
		return nil, fmt.Errorf("install shard %s: %d unit names; want 1 to %d", sh.ID, len(units), ledger.MaxDimensions)
	}
	for i := len(units); i < ledger.MaxDimensions; i++ {
		if sh.Allocated[i] != 0 {
			return nil, fmt.Errorf("install shard %s: allocation in dimension %d, which has no unit name", sh.ID, i)
		}
	}
	now := s.clock()
	holder := ledger.ShardHolder{GatewayID: s.gatewayID, BootEpoch: s.boot, NewestFence: s.newestFence[sh.Account.SubjectKey()]}
	if keys == nil {
		keys = s.keys
	}
	if err := ledger.VerifyShard(sh, keys, holder, now); err != nil {
		return nil, fmt.Errorf("install shard %s: %w", sh.ID, err)
	}
	if _, dup := s.shards[sh.ID]; dup {
		return nil, fmt.Errorf("install shard %s: %w: already installed", sh.ID, ledger.ErrShardIDReused)
	}
	if _, gone := s.ended[sh.ID]; gone {
		return nil, fmt.Errorf("install shard %s: %w: it was installed, reconciled and has ended", sh.ID, ledger.ErrShardIDReused)
	}
	if err := s.append(&shardRecord{Op: "install", At: now.UnixNano(), Shard: sh.ID, Token: token, Units: units}); err != nil {
		return nil, fmt.Errorf("install shard %s: %w", sh.ID, err)
	}
	s.install(sh, token, units, now)
	return sh, nil
}

// LocalReceipt is a local reservation as the store reports it, amounts by
// unit name.
type LocalReceipt struct {
	ShardID       string
	ReservationID string
	RequestDigest string
	OperationID   string
	State         ledger.State
	Reserved      Units
	Actual        Units
	// Overdraft is usage beyond what the shard could cover.
	Overdraft Units
	// Refunded is what this call gave back to the shard.
	Refunded Units
	Replayed bool
	// Retired is set on an answer from the tombstone of a reservation
	// whose shard ended and was compacted away (ShardStoreOptions.
	// TombstoneRetention): only the ids, digest and state are kept, the
	// units are empty, as for the ledger's retired receipts.
	Retired bool
}

// Has reports whether id is a local reservation of this store: of a
// shard it holds, or of an ended one whose tombstones it keeps. Every
// call on such an id is answered by the store, never by the ledger,
// which does not know it.
func (s *ShardStore) Has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, live := s.byReservation[id]
	_, retired := s.retired[id]
	return live || retired
}

// current returns the shard that decides for key in this boot: the
// newest fence of the subject, if it was issued to this boot. Whether it
// still admits (sealed, expired, overdrawn) is its local ledger's answer.
func (s *ShardStore) current(key ledger.PolicyKey) (string, *storedShard) {
	for i := len(s.order) - 1; i >= 0; i-- {
		st := s.shards[s.order[i]]
		sh := &st.local.Shard
		if sh.Account.SubjectKey() == key && sh.BootEpoch == s.boot && sh.Fence == s.newestFence[key] {
			return s.order[i], st
		}
	}
	return "", nil
}

// Reserve admits units under reservation id from this boot's shard of the
// subject, route and region (empty region: "global").
//
// Returns the RESERVED receipt (Replayed for a repeated id and digest);
// for the id of a reservation whose shard ended and was compacted away,
// the answer of its tombstone (Replayed and Retired for the same digest,
// else ErrDigestMismatch and ledger.ErrReservationRetired): a retry is
// never admitted again while the tombstone is kept;
// ErrNoShard when no shard of this boot covers the subject; errors wrapping
// ledger.ErrShardSealed,
// ledger.ErrInsufficientCapacity, ErrAdmissionFrozen, ErrShardExpired,
// ErrDigestMismatch, ErrInvalidCommand (or a unit the shard does not
// have); or a log write error.
func (s *ShardStore) Reserve(id, digest, subject, route, region string, units Units) (*LocalReceipt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken != nil {
		return nil, fmt.Errorf("local reserve %s: %w: %v", id, ErrShardStoreBroken, s.broken)
	}
	if region == "" {
		region = ledger.DefaultRegion
	}
	if t, ok := s.retired[id]; ok {
		return t.answer(id, "reserve", ledger.KindReserve, digest)
	}
	now := s.clock()
	shardID := s.byReservation[id]
	if shardID == "" {
		shardID, _ = s.current(ledger.PolicyKey{Subject: subject, Route: route, Region: region})
	}
	if shardID == "" {
		return nil, fmt.Errorf("local reserve %s: %w for %s/%s@%s", id, ErrNoShard, subject, route, region)
	}
	st := s.shards[shardID]
	amounts, err := toAmounts(st.units, units)
	if err != nil {
		return nil, fmt.Errorf("local reserve %s: %w", id, err)
	}
	return s.do(st, &shardRecord{Op: "reserve", Shard: shardID, ID: id, Digest: digest, Amounts: amounts}, now)
}

// Start binds operationID to a local reservation (STARTED). Errors as
// ledger.ShardLocal.Start, wrapped; ErrReservationNotFound for an id this
// store does not hold. On the id of a reservation whose shard ended and
// was compacted away, this and the other calls below answer from its
// tombstone (ledger.Tombstone.Answer: the error of its terminal state,
// wrapping ledger.ErrReservationRetired; a release of a released one
// replays).
func (s *ShardStore) Start(id, operationID string) (*LocalReceipt, error) {
	return s.reservationOp(&shardRecord{Op: "start", ID: id, Operation: operationID})
}

// Settle records the actual usage of started local work. Errors as
// ledger.ShardLocal.Settle, wrapped.
func (s *ShardStore) Settle(id, operationID string, actual Units) (*LocalReceipt, error) {
	return s.reservationOp(&shardRecord{Op: "settle", ID: id, Operation: operationID}, actual)
}

// Release gives an unstarted local hold back. Errors as
// ledger.ShardLocal.Release, wrapped.
func (s *ShardStore) Release(id string) (*LocalReceipt, error) {
	return s.reservationOp(&shardRecord{Op: "release", ID: id})
}

// MarkUsageUnknown records that started local work has no known usage.
// Errors as ledger.ShardLocal.MarkUsageUnknown, wrapped.
func (s *ShardStore) MarkUsageUnknown(id string) (*LocalReceipt, error) {
	return s.reservationOp(&shardRecord{Op: "unknown", ID: id})
}

func (s *ShardStore) reservationOp(rec *shardRecord, actual ...Units) (*LocalReceipt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken != nil {
		return nil, fmt.Errorf("local %s %s: %w: %v", rec.Op, rec.ID, ErrShardStoreBroken, s.broken)
	}
	if t, ok := s.retired[rec.ID]; ok {
		return t.answer(rec.ID, rec.Op, tombstoneKinds[rec.Op], "")
	}
	shardID, ok := s.byReservation[rec.ID]
	if !ok {
		return nil, fmt.Errorf("local %s: %w: %s", rec.Op, ledger.ErrReservationNotFound, rec.ID)
	}
	st := s.shards[shardID]
	rec.Shard = shardID
	if len(actual) > 0 {
		amounts, err := toAmounts(st.units, actual[0])
		if err != nil {
			return nil, fmt.Errorf("local %s %s: %w", rec.Op, rec.ID, err)
		}
		rec.Amounts = amounts
	}
	return s.do(st, rec, s.clock())
}

// do applies a reservation record and logs it when it changed something.
// The log write comes after the in-memory change, and a failed write
// breaks the store, so no answer is given for a change that is not durable.
func (s *ShardStore) do(st *storedShard, rec *shardRecord, now time.Time) (*LocalReceipt, error) {
	rec.At = now.UnixNano()
	res := s.applyReservation(rec, now, false)
	if res.Err != nil {
		return nil, fmt.Errorf("local %s %s: %w", rec.Op, rec.ID, res.Err)
	}
	if !res.Replayed {
		if err := s.append(rec); err != nil {
			return nil, fmt.Errorf("local %s %s: %w", rec.Op, rec.ID, err)
		}
	}
	return st.receipt(rec.Shard, &res.Reservation, res.Refunded, res.Replayed), nil
}

func (st *storedShard) receipt(shardID string, r *ledger.Reservation, refunded ledger.Amounts, replayed bool) *LocalReceipt {
	return &LocalReceipt{
		ShardID: shardID, ReservationID: r.ID, RequestDigest: r.RequestDigest, OperationID: r.OperationID, State: r.State,
		Reserved: fromAmounts(st.units, r.Reserved), Actual: fromAmounts(st.units, r.Actual),
		Overdraft: fromAmounts(st.units, r.Overdraft), Refunded: fromAmounts(st.units, refunded), Replayed: replayed,
	}
}

// toAmounts maps units by name to the shard's positions; an unknown name
// is an ErrInvalidCommand-wrapping error.
func toAmounts(names []string, units Units) (ledger.Amounts, error) {
	var out ledger.Amounts
	for name, v := range units {
		i := slices.Index(names, name)
		if i < 0 {
			return out, fmt.Errorf("%w: unit %q is not one of the shard's %v", ledger.ErrInvalidCommand, name, names)
		}
		out[i] = v
	}
	return out, nil
}

func fromAmounts(names []string, a ledger.Amounts) Units {
	out := make(Units, len(names))
	for i, name := range names {
		out[name] = a[i]
	}
	return out
}

// ShardStatus is one shard of the store and its local terms, by unit.
type ShardStatus struct {
	Shard     ledger.Shard
	Token     []byte
	Units     []string
	Allocated Units
	Available Units
	Reserved  Units
	Spent     Units
	Retired   Units
	Overdraft Units
	Sealed    bool
	// Live: this boot may admit from it now.
	Live bool
	// Submitted: the ledger accepted its first submission; Pending counts
	// receipts it left unknown that are not resolved centrally yet.
	Submitted bool
	Pending   int
	// Conservation is nil when allocated = available + reserved + spent +
	// retired holds (ledger.ShardLocal.Check).
	Conservation error
}

// Shards returns every shard of the store, in installation order.
func (s *ShardStore) Shards() []ShardStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	out := make([]ShardStatus, 0, len(s.order))
	for _, id := range s.order {
		st := s.shards[id]
		l := st.local
		currentID, _ := s.current(l.Shard.Account.SubjectKey())
		done, pending := l.Reconciled()
		out = append(out, ShardStatus{
			Shard: l.Shard, Token: slices.Clone(st.token), Units: slices.Clone(st.units),
			Allocated: fromAmounts(st.units, l.Shard.Allocated), Available: fromAmounts(st.units, l.Available),
			Reserved: fromAmounts(st.units, l.Reserved), Spent: fromAmounts(st.units, l.Spent),
			Retired: fromAmounts(st.units, l.Retired), Overdraft: fromAmounts(st.units, l.Overdraft),
			Sealed: l.Sealed, Live: currentID == id && !l.Sealed && now.Before(l.Shard.ExpiresAt) && l.Overdraft == (ledger.Amounts{}), Submitted: done, Pending: pending, Conservation: l.Check(),
		})
	}
	return out
}

// Receipts returns a shard's local receipts in admission order.
func (s *ShardStore) Receipts(shardID string) ([]LocalReceipt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.shards[shardID]
	if !ok {
		return nil, fmt.Errorf("receipts: %w: %s", ledger.ErrShardNotFound, shardID)
	}
	var out []LocalReceipt
	for _, r := range st.local.Reservations() {
		out = append(out, *st.receipt(shardID, &r, ledger.Amounts{}, false))
	}
	return out, nil
}

// Seal stops admission from a shard ahead of its reconciliation: its
// unstarted holds are released, its available units retired. Sealing a
// sealed shard does nothing.
func (s *ShardStore) Seal(shardID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seal(shardID)
}

func (s *ShardStore) seal(shardID string) error {
	if s.broken != nil {
		return fmt.Errorf("seal %s: %w: %v", shardID, ErrShardStoreBroken, s.broken)
	}
	st, ok := s.shards[shardID]
	if _, gone := s.ended[shardID]; !ok && gone {
		return nil // ended: sealed for good
	}
	if !ok {
		return fmt.Errorf("seal: %w: %s", ledger.ErrShardNotFound, shardID)
	}
	if st.local.Sealed {
		return nil
	}
	now := s.clock()
	if err := s.append(&shardRecord{Op: "seal", At: now.UnixNano(), Shard: shardID}); err != nil {
		return fmt.Errorf("seal %s: %w", shardID, err)
	}
	st.local.Seal(now)
	return nil
}

// ShardSubmission is what the gateway sends the ledger for one shard.
type ShardSubmission struct {
	ShardID  string
	Units    []string
	Receipts []ledger.ShardReceipt
	// First is set while the ledger has accepted no submission of the
	// shard from this store: these receipts are its first report.
	First bool
	// Resumed is set when the submission was logged before this
	// BeginSubmission (an earlier attempt, maybe by an earlier process,
	// may have been applied with its answer lost).
	Resumed bool
}

// BeginSubmission seals the shard and returns the receipts to report now,
// logged before they are sent so that a retry after a lost answer (even
// from a restarted process) sends exactly the same ones. ok is false when
// there is nothing to report (the first submission was accepted and no
// unknown receipt has been resolved since).
func (s *ShardStore) BeginSubmission(shardID string) (sub ShardSubmission, ok bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.seal(shardID); err != nil {
		return sub, false, err
	}
	st, ok := s.shards[shardID]
	if !ok { // ended and compacted away (seal found it so): nothing to report
		return sub, false, nil
	}
	resumed := st.submitting != nil
	if st.submitting == nil {
		receipts, due := st.local.Submission()
		if !due {
			return sub, false, nil
		}
		if receipts == nil {
			receipts = []ledger.ShardReceipt{}
		}
		if err := s.append(&shardRecord{Op: "submitting", At: s.clock().UnixNano(), Shard: shardID, Receipts: receipts}); err != nil {
			return sub, false, fmt.Errorf("submit %s: %w", shardID, err)
		}
		st.submitting = receipts
	}
	done, _ := st.local.Reconciled()
	return ShardSubmission{ShardID: shardID, Units: slices.Clone(st.units), Receipts: slices.Clone(st.submitting),
		First: !done, Resumed: resumed}, true, nil
}

// DueReceipts returns the receipts of shard shardID that Emergency.Reconcile
// would send now, as the ledger receives them (for a hand reconciliation,
// `capledger shard receipts`): the submission in flight if there is one,
// else what the shard has to report; none when there is nothing to report
// or the shard is not sealed (a shard of this boot still admitting; every
// shard of an earlier boot is sealed when the store opens). It changes
// nothing. An empty list is both "nothing to report" and the first
// report of a shard nothing was admitted from: DueSubmission tells them
// apart.
func (s *ShardStore) DueReceipts(shardID string) ([]*ledgerv1.ShardReceipt, error) {
	receipts, _, err := s.DueSubmission(shardID)
	return receipts, err
}

// DueSubmission is DueReceipts with due: whether Emergency.Reconcile
// would send a submission now. Due with no receipts is the first report
// of a shard nothing was admitted from (reconciled empty, all of it is
// reminted); not due is nothing to report (its first report was
// accepted and no receipt has been resolved since, or it still admits).
func (s *ShardStore) DueSubmission(shardID string) (receipts []*ledgerv1.ShardReceipt, due bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.shards[shardID]
	if !ok {
		return nil, false, fmt.Errorf("receipts: %w: %s", ledger.ErrShardNotFound, shardID)
	}
	local, due := st.submitting, st.submitting != nil
	if !due {
		local, due = st.local.Submission()
	}
	return wireReceipts(st.units, local), due, nil
}

// FinishSubmission records that the ledger accepted the submission in
// flight, or refused it as already reconciled (an earlier attempt of the
// same submission was accepted and its answer lost).
func (s *ShardStore) FinishSubmission(shardID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken != nil {
		return fmt.Errorf("submitted %s: %w: %v", shardID, ErrShardStoreBroken, s.broken)
	}
	st, ok := s.shards[shardID]
	if !ok || st.submitting == nil {
		return fmt.Errorf("submitted %s: no submission in flight", shardID)
	}
	if err := s.append(&shardRecord{Op: "submitted", At: s.clock().UnixNano(), Shard: shardID, Receipts: st.submitting}); err != nil {
		return fmt.Errorf("submitted %s: %w", shardID, err)
	}
	st.local.Submitted(st.submitting)
	st.submitting = nil
	s.maybeCompact()
	return nil
}

// FinishReceipts records that the ledger waits for none of the receipts
// ids of the submission in flight any more (another submission, such as
// an operator's `capledger shard reconcile --receipts`, resolved them), and
// ends that submission: the next BeginSubmission sends the receipts still
// pending. Only after the first submission was accepted; ids not in the
// submission in flight are ignored.
func (s *ShardStore) FinishReceipts(shardID string, ids []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken != nil {
		return fmt.Errorf("resolved elsewhere %s: %w: %v", shardID, ErrShardStoreBroken, s.broken)
	}
	st, ok := s.shards[shardID]
	if !ok || st.submitting == nil {
		return fmt.Errorf("resolved elsewhere %s: no submission in flight", shardID)
	}
	if done, _ := st.local.Reconciled(); !done {
		return fmt.Errorf("resolved elsewhere %s: the first submission was not accepted yet", shardID)
	}
	var finished []ledger.ShardReceipt
	for _, r := range st.submitting {
		if slices.Contains(ids, r.ReservationID) {
			finished = append(finished, r)
		}
	}
	if finished == nil {
		finished = []ledger.ShardReceipt{}
	}
	if err := s.append(&shardRecord{Op: "submitted", At: s.clock().UnixNano(), Shard: shardID, Receipts: finished}); err != nil {
		return fmt.Errorf("resolved elsewhere %s: %w", shardID, err)
	}
	st.local.Submitted(finished)
	st.submitting = nil
	s.maybeCompact()
	return nil
}

// shardOf returns the shard holding local reservation id (nil if none).
func (s *ShardStore) shardOf(id string) *ledger.Shard {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.shards[s.byReservation[id]]
	if !ok {
		return nil
	}
	sh := st.local.Shard
	return &sh
}
