package engine

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/capledger/capledger/ledger"
)

// fileStage is the ledger.CheckpointStage of a cut: the new checkpoint's
// accounts in an unlinked temporary file in the store's directory
// (Snapshot.TempDir) between the audit's pass over the accounts and
// their writing, about 140 bytes an account on disk, 128 KiB of buffers in memory.
// It lets the cut read the accounts once and end the store's read before
// it writes (docs/PERFORMANCE.md, a million tenants).
type fileStage struct {
	f   *os.File
	w   *bufio.Writer
	buf []byte
	n   int64
	err error // the first error of Put or Each
}

func newFileStage(dir string) (*fileStage, error) {
	f, err := os.CreateTemp(dir, ".capledger-cut-*")
	if err != nil {
		return nil, fmt.Errorf("checkpoint stage: %w", err)
	}
	// Unlinked at once: the space goes back when the file is closed,
	// whatever ends the process.
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("checkpoint stage: %w", err)
	}
	return &fileStage{f: f, w: bufio.NewWriterSize(f, 64<<10), buf: make([]byte, 0, 512)}, nil
}

func (s *fileStage) fail(err error) error {
	if s.err == nil {
		s.err = fmt.Errorf("checkpoint stage: %w", err)
	}
	return s.err
}

// Put implements ledger.CheckpointStage: a length, then the account.
func (s *fileStage) Put(a *ledger.CheckpointAccount) error {
	if s.err != nil {
		return s.err
	}
	b := appendStaged(s.buf[:0], a)
	var n [binary.MaxVarintLen64]byte
	if _, err := s.w.Write(n[:binary.PutUvarint(n[:], uint64(len(b)))]); err != nil {
		return s.fail(err)
	}
	if _, err := s.w.Write(b); err != nil {
		return s.fail(err)
	}
	s.buf = b
	s.n++
	return nil
}

// Each implements ledger.CheckpointStage.
func (s *fileStage) Each(yield func(*ledger.CheckpointAccount) error) error {
	if s.err != nil {
		return s.err
	}
	if err := s.w.Flush(); err != nil {
		return s.fail(err)
	}
	if _, err := s.f.Seek(0, io.SeekStart); err != nil {
		return s.fail(err)
	}
	r := bufio.NewReaderSize(s.f, 64<<10)
	var a ledger.CheckpointAccount
	for i := int64(0); i < s.n; i++ {
		size, err := binary.ReadUvarint(r)
		if err == nil && size > 1<<20 {
			err = errors.New("a record too long")
		}
		if err == nil {
			s.buf = s.buf[:0]
			s.buf = append(s.buf, make([]byte, size)...)
			_, err = io.ReadFull(r, s.buf)
		}
		if err == nil {
			err = readStaged(&a, s.buf)
		}
		if err != nil {
			return s.fail(fmt.Errorf("account %d of %d: %w", i+1, s.n, err))
		}
		if err := yield(&a); err != nil {
			return err
		}
	}
	return nil
}

func (s *fileStage) close() { s.f.Close() }

func appendStagedString(b []byte, v string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(v))), v...)
}

// appendStaged encodes a: the key, every balance term, the entry count,
// the journal digest.
func appendStaged(b []byte, a *ledger.CheckpointAccount) []byte {
	b = appendStagedString(b, a.Account.Subject)
	b = appendStagedString(b, a.Account.Route)
	b = appendStagedString(b, a.Account.Region)
	b = binary.AppendUvarint(b, a.Account.Generation)
	for i := range a.Balances {
		x := &a.Balances[i]
		for _, v := range [...]ledger.Units{x.Opening, x.Minted, x.OverdraftIssued, x.Available, x.Reserved, x.Spent,
			x.RetiredForEmergency, x.RetiredForMove, x.OverdraftRepaid} {
			b = binary.AppendVarint(b, v)
		}
	}
	b = binary.AppendVarint(b, a.Entries)
	return appendStagedString(b, a.Journal)
}

// stagedReader decodes what appendStaged wrote.
type stagedReader struct {
	b   []byte
	err error
}

func (r *stagedReader) uvarint() uint64 { return decodeNext(r, binary.Uvarint) }

func (r *stagedReader) varint() int64 { return decodeNext(r, binary.Varint) }

// decodeNext decodes the next number with decode, or records a record cut
// short.
func decodeNext[T uint64 | int64](r *stagedReader, decode func([]byte) (T, int)) T {
	v, n := decode(r.b)
	if n <= 0 {
		r.err, r.b = errors.New("a record cut short"), nil
		return 0
	}
	r.b = r.b[n:]
	return v
}

// string returns the next string, old itself when it is the same (the
// route and region of most accounts repeat).
func (r *stagedReader) string(old string) string {
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		r.err, r.b = errors.New("a record cut short"), nil
		return ""
	}
	v := r.b[:n]
	r.b = r.b[n:]
	if string(v) == old {
		return old
	}
	return string(v)
}

// readStaged decodes an account into a, reusing a's route and region
// strings when they repeat.
func readStaged(a *ledger.CheckpointAccount, b []byte) error {
	r := stagedReader{b: b}
	a.Account.Subject = r.string("")
	a.Account.Route = r.string(a.Account.Route)
	a.Account.Region = r.string(a.Account.Region)
	a.Account.Generation = r.uvarint()
	for i := range a.Balances {
		x := &a.Balances[i]
		for _, v := range [...]*ledger.Units{&x.Opening, &x.Minted, &x.OverdraftIssued, &x.Available, &x.Reserved, &x.Spent,
			&x.RetiredForEmergency, &x.RetiredForMove, &x.OverdraftRepaid} {
			*v = r.varint()
		}
	}
	a.Entries = r.varint()
	a.Journal = r.string("")
	if r.err == nil && len(r.b) > 0 {
		r.err = fmt.Errorf("%d bytes after a record", len(r.b))
	}
	return r.err
}
