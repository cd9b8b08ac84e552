package client

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"

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

// ended reports whether st is an ended shard (see above).
func (st *storedShard) ended() bool {
	done, pending := st.local.Reconciled()
	return st.local.Sealed && done && pending == 0 && st.submitting == nil
}

// maybeCompact compacts the log when the records of ended shards take at
// least compactAt bytes and more than those of the shards kept, so the
// log stays under twice what the kept shards need (plus compactAt), and
// each rewrite is paid for by at least as many bytes dropped. A
// compaction that fails before the new log replaces the old one leaves
// the store as it was (it is tried again at the next trigger); one that
// fails after breaks the store (s.broken), as a failed append does.
func (s *ShardStore) maybeCompact() {
	if s.broken != nil || s.compactAt < 0 {
		return
	}
	var endedBytes, keptBytes int64
	for id, st := range s.shards {
		if st.ended() {
			endedBytes += s.logBytes[id]
		} else {
			keptBytes += s.logBytes[id]
		}
	}
	if endedBytes < s.compactAt || endedBytes <= keptBytes {
		return
	}
	_ = s.compact() // on failure the store goes on with the old log
}

// compact writes the log without the ended shards' records to a new file,
// syncs it, renames it over the log and syncs the directory: a crash at
// any point leaves either the old log or the new one, whole (a new file
// left unrenamed is removed at open). Then it drops the ended shards from
// memory. The caller holds s.mu.
func (s *ShardStore) compact() error {
	ended := map[string]bool{}
	for id, st := range s.shards {
		if st.ended() {
			ended[id] = true
		}
	}
	path := filepath.Join(s.dir, shardLogName)
	newPath := filepath.Join(s.dir, shardLogCompacting)
	kept, err := writeCompacted(path, newPath, ended)
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
	if err := syncDir(s.dir); err != nil {
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
	if s.compacted == nil {
		s.compacted = map[string]bool{}
	}
	for id := range ended {
		s.compacted[id] = true
		delete(s.shards, id)
	}
	order := s.order[:0]
	for _, id := range s.order {
		if !ended[id] {
			order = append(order, id)
		}
	}
	clear(s.order[len(order):])
	s.order = order
	for rid, id := range s.byReservation {
		if ended[id] {
			delete(s.byReservation, rid)
		}
	}
	return nil
}

// writeCompacted writes to newPath the records of the log at path that a
// replay needs once the ended shards are dropped, syncs and closes it, and
// returns the bytes each kept shard's records take in it.
//
// Besides the kept shards' records: of each run of boot records with no
// kept record between them only the first is written (its time is when
// the run's first boot inherited the shards before it), carrying the
// run's last boot epoch; and where an ended shard's install sealed an
// older-fence kept shard of its subject, a seal of that shard at the same
// time takes its place.
func writeCompacted(path, newPath string, ended map[string]bool) (map[string]int64, error) {
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
		case ended[rec.Shard]:
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
	if err := w.Flush(); err != nil {
		return nil, fmt.Errorf("compact shard log: %w", err)
	}
	if err := dst.Sync(); err != nil {
		return nil, fmt.Errorf("compact shard log: %w", err)
	}
	if err := dst.Close(); err != nil {
		return nil, fmt.Errorf("compact shard log: %w", err)
	}
	return kept, nil
}

// syncDir fsyncs a directory, making a rename in it durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
