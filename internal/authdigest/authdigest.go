// Package authdigest is the one rule for identifying a registry username/password without
// revealing it: the digest ghcrsync compares between the desired credential and the credential
// a node's Talos config carries.
package authdigest

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strings"
)

// DockerConfig identifies a dockerconfigjson: the hex SHA-256 of its bytes. It is the credential
// revision, and a pull secret is in sync when the digest of what it holds equals it.
func DockerConfig(data []byte) string {
	sum := sha256.Sum256(data)

	return hex.EncodeToString(sum[:])
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
