// Package secrets seals credential values for storage: AES-256-GCM under a key kept in a file
// of its own (SPACE_HOME/secrets.key, mode 0600), with the secret's tenant and name as
// associated data, so that a sealed value cannot be moved to another secret.
package secrets

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/space-sandbox/space/internal/durable"
)

// Box seals and opens values.
type Box struct{ aead cipher.AEAD }

// LoadOrCreate reads the key in dir/secrets.key, making it the first time.
func LoadOrCreate(dir string) (*Box, error) {
	path := filepath.Join(dir, "secrets.key")
	key, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		// Made once, never replaced: values sealed under a key that another start overwrote
		// could not be opened again. If another start made it first, its key is the one.
		err = durable.CreateFile(path, key, 0o600)
		if errors.Is(err, fs.ErrExist) {
			key, err = os.ReadFile(path)
		}
		if err != nil {
			return nil, fmt.Errorf("secrets key: %w", err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("secrets key %s: want 32 bytes, have %d", path, len(key))
	}
	fi, err := os.Stat(path)
	if err == nil && fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("secrets key %s: mode %v lets others read it; want 0600", path, fi.Mode().Perm())
	}
	return New(key)
}

// New returns a Box for a 32-byte key.
func New(key []byte) (*Box, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Box{aead: aead}, nil
}

// Seal encrypts value for the secret named by id (tenant and name).
func (b *Box) Seal(value []byte, id string) []byte {
	nonce := make([]byte, b.aead.NonceSize())
	rand.Read(nonce)
	return b.aead.Seal(nonce, nonce, value, []byte(id))
}

// Open decrypts what Seal made for id.
func (b *Box) Open(sealed []byte, id string) ([]byte, error) {
	n := b.aead.NonceSize()
	if len(sealed) < n {
		return nil, errors.New("secrets: sealed value too short")
	}
	v, err := b.aead.Open(nil, sealed[:n], sealed[n:], []byte(id))
	if err != nil {
		return nil, errors.New("secrets: sealed value does not open (wrong key or tampered)")
	}
	return v, nil
}
