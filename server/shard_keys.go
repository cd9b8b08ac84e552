package server

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/capledger/capledger/ledger"
)

// ShardKeys is the server's Ed25519 key ring for emergency shards, read
// from a keys file or a directory of them. Each non-blank line that does not
// start with # is
//
//	<key-id> private <base64 of the 32-byte Ed25519 seed>
//	<key-id> public  <base64 of the 32-byte Ed25519 public key>
//
// The last private key (in file order; a directory's files in name order)
// signs new shards; every listed key verifies. Rotation: append a new
// private line (capledger shard keygen prints one); shards signed with the
// old key keep verifying while its line stays (it may be turned into a
// public line, which drops the private half); removing the line revokes it.
// The ring reloads itself when the file or directory changes, checked at
// most once a second when it is used or watched (Watch), so a rotation
// needs no restart. A file holding
// private keys must not be readable by group or others.
//
// ShardKeys implements ledger.ShardKeys.
type ShardKeys struct {
	path string

	mu        sync.RWMutex
	signing   string
	private   map[string]ed25519.PrivateKey
	public    map[string]ed25519.PublicKey
	order     []string
	stamp     string
	checkedAt time.Time
	reloadErr error
	// log, when set (LogReloads), hears of every reload: a failed one once
	// per change of the files (failedStamp), as TLS certificates are.
	log         *slog.Logger
	failedStamp string
}

// LogReloads makes the ring log its reloads to log: "shard keys reloaded"
// with the signing key, or, once per change of the files, "shard keys not
// reloaded: keeping the previous ones" with the error (a rotation line
// pasted half, a mode readable by others), which the previous keys outlive.
func (k *ShardKeys) LogReloads(log *slog.Logger) {
	k.mu.Lock()
	k.log = log
	k.mu.Unlock()
}

// maxKeyIDBytes bounds a shard key's id, a name by ledger.NameProblem.
const maxKeyIDBytes = 64

// goodKeyID reports whether id may name a shard key (ledger.NameProblem).
func goodKeyID(id string) bool { return ledger.NameProblem(id, maxKeyIDBytes) == "" }

// LoadShardKeys reads the keys at path (a file, or a directory whose
// regular files not starting with "." are read in name order). It returns
// an error naming the file and line of the first problem: a malformed
// line, a repeated key id, a private key file readable by others, or no key
// at all.
func LoadShardKeys(path string) (*ShardKeys, error) {
	k := &ShardKeys{path: path}
	if err := k.load(); err != nil {
		return nil, err
	}
	return k, nil
}

// ParseShardKeys reads a key ring from r (the keys-file format), for keys
// that live nowhere on disk (an ephemeral in-memory server); it never
// reloads. source names r in errors.
func ParseShardKeys(r io.Reader, source string) (*ShardKeys, error) {
	private := map[string]ed25519.PrivateKey{}
	public := map[string]ed25519.PublicKey{}
	var order []string
	signing := ""
	if err := parseShardKeys(r, source, 0o600, private, public, &order, &signing); err != nil {
		return nil, err
	}
	if len(order) == 0 {
		return nil, fmt.Errorf("shard keys %s: no keys", source)
	}
	return &ShardKeys{private: private, public: public, order: order, signing: signing}, nil
}

// EnsureShardKeys loads the keys file at path, creating it with one new
// private key first when it does not exist. created reports whether it did.
// This is what `capledger serve` does in its data directory when no
// --shard-keys is given.
func EnsureShardKeys(path string) (keys *ShardKeys, created bool, err error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		line, err := NewShardKeyLine("", rand.Reader, time.Now())
		if err != nil {
			return nil, false, err
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, false, fmt.Errorf("shard keys: %w", err)
		}
		content := "# capledger emergency-shard signing keys (see `capledger shard --help`).\n" +
			"# The last private key signs; every key listed verifies.\n" + line
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, false, fmt.Errorf("shard keys: %w", err)
		}
		_, werr := f.WriteString(content)
		if werr == nil {
			werr = f.Sync()
		}
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return nil, false, fmt.Errorf("shard keys %s: %w", path, werr)
		}
		created = true
	}
	keys, err = LoadShardKeys(path)
	return keys, created, err
}

// NewShardKeyLine returns a keys-file line (with its newline) holding a
// new private key drawn from random. An empty keyID becomes
// "k<yyyymmdd>-<8 hex digits>" from now and the key's own bytes.
func NewShardKeyLine(keyID string, random io.Reader, now time.Time) (string, error) {
	seed := make([]byte, ed25519.SeedSize)
	if _, err := io.ReadFull(random, seed); err != nil {
		return "", fmt.Errorf("shard key: %w", err)
	}
	if keyID == "" {
		pub := ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)
		keyID = fmt.Sprintf("k%s-%x", now.UTC().Format("20060102"), pub[:4])
	}
	if !goodKeyID(keyID) {
		return "", fmt.Errorf("shard key id %q: use 1 to 64 letters, digits, '.', '_' or '-'", keyID)
	}
	return keyID + " private " + base64.StdEncoding.EncodeToString(seed) + "\n", nil
}

// files returns the key files of the path and a stamp that changes when
// any of them (or the set) changes: its content (modification time,
// size) or its mode, so that a chmod alone making a private key file
// readable by others is noticed (and refused) as an edit is.
func (k *ShardKeys) files() ([]string, string, error) {
	info, err := os.Stat(k.path)
	if err != nil {
		return nil, "", fmt.Errorf("shard keys: %w", err)
	}
	if !info.IsDir() {
		return []string{k.path}, fmt.Sprint(info.ModTime().UnixNano(), info.Size(), info.Mode()), nil
	}
	entries, err := os.ReadDir(k.path)
	if err != nil {
		return nil, "", fmt.Errorf("shard keys: %w", err)
	}
	var files []string
	var stamp strings.Builder
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") || !e.Type().IsRegular() {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return nil, "", fmt.Errorf("shard keys: %w", err)
		}
		files = append(files, filepath.Join(k.path, e.Name()))
		fmt.Fprint(&stamp, e.Name(), fi.ModTime().UnixNano(), fi.Size(), fi.Mode(), ";")
	}
	return files, stamp.String(), nil
}

func (k *ShardKeys) load() error {
	files, stamp, err := k.files()
	if err != nil {
		return err
	}
	private := map[string]ed25519.PrivateKey{}
	public := map[string]ed25519.PublicKey{}
	var order []string
	signing := ""
	for _, name := range files {
		if err := parseShardKeyFile(name, private, public, &order, &signing); err != nil {
			return err
		}
	}
	if len(order) == 0 {
		return fmt.Errorf("shard keys %s: no keys", k.path)
	}
	k.mu.Lock()
	k.private, k.public, k.order, k.signing, k.stamp = private, public, order, signing, stamp
	k.mu.Unlock()
	return nil
}

func parseShardKeyFile(name string, private map[string]ed25519.PrivateKey, public map[string]ed25519.PublicKey, order *[]string, signing *string) error {
	f, err := os.Open(name)
	if err != nil {
		return fmt.Errorf("shard keys: %w", err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return fmt.Errorf("shard keys: %w", err)
	}
	return parseShardKeys(f, name, info.Mode().Perm(), private, public, order, signing)
}

// parseShardKeys reads key lines from r; mode is the file's permission
// bits (private keys are refused in a file others may read).
func parseShardKeys(r io.Reader, name string, mode os.FileMode, private map[string]ed25519.PrivateKey, public map[string]ed25519.PublicKey, order *[]string, signing *string) error {
	scanner := bufio.NewScanner(r)
	hasPrivate := false
	for line := 1; scanner.Scan(); line++ {
		text := strings.TrimSpace(scanner.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		fields := strings.Fields(text)
		if len(fields) != 3 {
			return fmt.Errorf("shard keys %s:%d: want \"<key-id> private|public <base64>\"", name, line)
		}
		id, kind := fields[0], fields[1]
		if !goodKeyID(id) {
			return fmt.Errorf("shard keys %s:%d: key id %q: use 1 to 64 letters, digits, '.', '_' or '-'", name, line, id)
		}
		if _, dup := public[id]; dup {
			return fmt.Errorf("shard keys %s:%d: key id %q appears twice", name, line, id)
		}
		raw, err := base64.StdEncoding.DecodeString(fields[2])
		if err != nil {
			return fmt.Errorf("shard keys %s:%d: key %s: %v", name, line, id, err)
		}
		switch kind {
		case "private":
			if len(raw) != ed25519.SeedSize {
				return fmt.Errorf("shard keys %s:%d: key %s: a private key is a %d-byte seed, got %d bytes", name, line, id, ed25519.SeedSize, len(raw))
			}
			priv := ed25519.NewKeyFromSeed(raw)
			private[id] = priv
			public[id] = priv.Public().(ed25519.PublicKey)
			*signing = id
			hasPrivate = true
		case "public":
			if len(raw) != ed25519.PublicKeySize {
				return fmt.Errorf("shard keys %s:%d: key %s: a public key is %d bytes, got %d", name, line, id, ed25519.PublicKeySize, len(raw))
			}
			public[id] = ed25519.PublicKey(raw)
		default:
			return fmt.Errorf("shard keys %s:%d: key %s: kind %q is neither private nor public", name, line, id, kind)
		}
		*order = append(*order, id)
	}
	if err := scanner.Err(); err != nil {
		return fmt.Errorf("shard keys %s: %w", name, err)
	}
	if hasPrivate && mode&0o077 != 0 {
		return fmt.Errorf("shard keys %s holds private keys but its mode is %v: chmod 600 it", name, mode)
	}
	return nil
}

// refresh reloads the ring when its files changed, at most once a second.
// A reload that fails keeps the previous keys (and remembers the error for
// ReloadError): a half-edited file never leaves the server without keys.
func (k *ShardKeys) refresh() {
	if k.path == "" {
		return
	}
	now := time.Now()
	k.mu.RLock()
	recent := now.Sub(k.checkedAt) < time.Second
	stamp, failed := k.stamp, k.failedStamp != ""
	k.mu.RUnlock()
	if recent {
		return
	}
	k.mu.Lock()
	k.checkedAt = now
	k.mu.Unlock()
	_, current, err := k.files()
	// Files back to the loaded ones after a failed reload (a chmod undone)
	// load again, so that the failure is cleared and the reload logged.
	if err == nil && current == stamp && !failed {
		return
	}
	if err != nil {
		current = "error: " + err.Error()
	} else {
		err = k.load()
	}
	k.mu.Lock()
	k.reloadErr = err
	log, logged := k.log, k.failedStamp == current
	if err != nil {
		k.failedStamp = current
	} else {
		k.failedStamp = ""
	}
	signing := k.signing
	k.mu.Unlock()
	switch {
	case log == nil:
	case err != nil && !logged:
		log.Warn("shard keys not reloaded: keeping the previous ones", "path", k.path, "err", err)
	case err == nil:
		log.Info("shard keys reloaded", "path", k.path, "signing", signing)
	}
}

// Watch checks the ring's files every interval until ctx ends. Without
// it the ring looks at its files only when a shard is issued or verified
// or the keys are listed, so a rotation on an idle server was neither
// loaded nor logged ("shard keys reloaded", or a line that does not load)
// until then: the operator appending a key saw nothing. serve runs it.
func (k *ShardKeys) Watch(ctx context.Context, interval time.Duration) {
	if k.path == "" {
		return // keys that live nowhere on disk never change
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			k.refresh()
		}
	}
}

// ReloadError returns the error of the last failed reload (nil when the
// last reload worked or none was needed).
func (k *ShardKeys) ReloadError() error {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.reloadErr
}

// ShardPublicKey returns the public key of keyID, if the ring holds it.
func (k *ShardKeys) ShardPublicKey(keyID string) (ed25519.PublicKey, bool) {
	k.refresh()
	k.mu.RLock()
	defer k.mu.RUnlock()
	pub, ok := k.public[keyID]
	return pub, ok
}

// Signer returns the signing key's id and a deterministic signing
// function for ledger.ShardArgs; ok is false when the ring holds no
// private key (it can verify, not issue).
func (k *ShardKeys) Signer() (keyID string, sign func([]byte) []byte, ok bool) {
	k.refresh()
	k.mu.RLock()
	defer k.mu.RUnlock()
	if k.signing == "" {
		return "", nil, false
	}
	priv := k.private[k.signing]
	return k.signing, func(canonical []byte) []byte { return ed25519.Sign(priv, canonical) }, true
}

// ShardPublicKeyInfo is one key of the ring as ListShardKeys shows it.
type ShardPublicKeyInfo struct {
	KeyID     string
	PublicKey ed25519.PublicKey
	Signing   bool
}

// Keys returns every key of the ring, in file order.
func (k *ShardKeys) Keys() []ShardPublicKeyInfo {
	k.refresh()
	k.mu.RLock()
	defer k.mu.RUnlock()
	out := make([]ShardPublicKeyInfo, 0, len(k.order))
	for _, id := range k.order {
		out = append(out, ShardPublicKeyInfo{KeyID: id, PublicKey: slices.Clone(k.public[id]), Signing: id == k.signing})
	}
	return out
}
