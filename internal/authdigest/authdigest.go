// Package authdigest is the one rule for identifying a registry username/password without
// revealing it: the digest ghcrsync compares between the desired credential and the credential
// a node's Talos config carries.
package authdigest

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"strings"
)

// DockerConfig identifies a dockerconfigjson: the hex SHA-256 of its canonical JSON (keys
// sorted, no insignificant space), so the same content written by another tool — fields in
// another order, indented — has the same digest. Bytes that are not JSON are digested as they
// are. It is the credential revision, and a pull secret is in sync when the digest of what it
// holds equals the desired one.
func DockerConfig(data []byte) string {
	sum := sha256.Sum256(canonical(data))

	return hex.EncodeToString(sum[:])
}

// canonical re-encodes JSON with sorted keys (numbers kept as written); anything else is
// returned unchanged.
func canonical(data []byte) []byte {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()

	var v any
	if err := dec.Decode(&v); err != nil || dec.More() {
		return data
	}

	out, err := json.Marshal(v)
	if err != nil {
		return data
	}

	return out
}

// Of is the hex SHA-256 of "username:password" ("" when both are empty). Registry tokens are
// high-entropy, so the digest does not reveal them.
func Of(username, password string) string {
	if username == "" && password == "" {
		return ""
	}

	sum := sha256.Sum256([]byte(username + ":" + password))

	return hex.EncodeToString(sum[:])
}

// FromFields digests a registry auth entry given as username/password or as auth (base64 of
// "username:password"), the two forms of dockerconfigjson and of Talos's RegistryAuthConfig.
func FromFields(username, password, auth string) string {
	if username == "" && password == "" && auth != "" {
		raw, err := base64.StdEncoding.DecodeString(auth)
		if err != nil {
			return ""
		}

		username, password, _ = strings.Cut(string(raw), ":")
	}

	return Of(username, password)
}
