package keyring

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/authdigest"
)

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func TestMerge(t *testing.T) {
	const reg = "ghcr.io"

	newEntry := Entry("bot", "ghp_new")
	newDigest := authdigest.Of("bot", "ghp_new")
	oldDigest := authdigest.Of("bot", "ghp_old")

	cases := []struct {
		name    string
		current string // "" for no file
		want    string // the file written
		before  []string
		kept    int
		created bool
		changed bool
		err     error
	}{
		{
			name: "no_file", want: `{"auths":{"ghcr.io":` + string(newEntry) + `}}` + "\n", created: true, changed: true,
		},
		{
			name: "empty_object", current: `{}`, want: `{"auths":{"ghcr.io":` + string(newEntry) + `}}` + "\n", changed: true,
		},
		{
			name:    "other_registries_kept_byte_for_byte",
			current: `{"auths": {"quay.io": {"auth" : "` + b64("q:pw") + `",  "email": "ops@example.com"}, "ghcr.io": {"auth": "` + b64("bot:ghp_old") + `"}}, "credsStore": "pass"}`,
			want:    `{"auths":{"ghcr.io":` + string(newEntry) + `,"quay.io":{"auth" : "` + b64("q:pw") + `",  "email": "ops@example.com"}},"credsStore":"pass"}` + "\n",
			before:  []string{oldDigest}, kept: 1, changed: true,
		},
		{
			name:    "every_alias_of_the_host_replaced",
			current: `{"auths":{"https://ghcr.io/v2/":{"username":"bot","password":"ghp_old"},"ghcr.io/team-a":{"auth":"` + b64("a:x") + `"},"ghcr.io.evil.example":{"auth":"` + b64("e:x") + `"}}}`,
			want:    `{"auths":{"ghcr.io":` + string(newEntry) + `,"ghcr.io.evil.example":{"auth":"` + b64("e:x") + `"}}}` + "\n",
			before:  []string{oldDigest, authdigest.Of("a", "x")}, kept: 1, changed: true,
		},
		{
			name:    "already_holding_exactly_this",
			current: `{"auths":{"ghcr.io":` + string(newEntry) + `}}` + "\n",
			want:    `{"auths":{"ghcr.io":` + string(newEntry) + `}}` + "\n",
			before:  []string{newDigest},
		},
		{name: "not_json", current: `{"auths":`, err: ErrUnreadable},
		{name: "not_an_object", current: `["ghcr.io"]`, err: ErrUnreadable},
		{name: "auths_not_an_object", current: `{"auths":"ghcr.io"}`, err: ErrUnreadable},
		{name: "another_entry_the_kubelet_cannot_read", current: `{"auths":{"quay.io":{"auth":"not base64!"}}}`, err: ErrUnreadable},
		{name: "trailing_value", current: `{"auths":{}} {}`, err: ErrUnreadable},
	}

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var current []byte
			if c.current != "" {
				current = []byte(c.current)
			}

			out, r, err := Merge(current, reg, newEntry)

			switch {
			case c.err != nil:
				if !errors.Is(err, c.err) {
					t.Fatalf("err %v, want %v", err, c.err)
				}

				if strings.Contains(err.Error(), "ghp_") || strings.Contains(err.Error(), b64("q:pw")) {
					t.Fatalf("the error quotes the file: %v", err)
				}

				return
			case err != nil:
				t.Fatal(err)
			}

			if string(out) != c.want {
				t.Fatalf("wrote\n%s\nwant\n%s", out, c.want)
			}

			want := Report{Before: c.before, After: newDigest, Kept: c.kept, Created: c.created, Changed: c.changed}
			if r.String() != want.String() {
				t.Fatalf("report %s, want %s", r, want)
			}

			if strings.Contains(r.String(), "ghp_") {
				t.Fatalf("the report quotes a credential: %s", r)
			}

			if err := Readable(out); err != nil {
				t.Fatalf("the kubelet could not read what was written: %v", err)
			}
		})
	}
}

func TestRemoveAndRead(t *testing.T) {
	cur := []byte(`{"auths":{"ghcr.io":{"auth":"` + b64("bot:ghp_old") + `"},"quay.io":{"auth":"` + b64("q:pw") + `"}}}`)

	r, err := Read(cur, "ghcr.io")
	if err != nil || len(r.Before) != 1 || r.Before[0] != authdigest.Of("bot", "ghp_old") || r.Kept != 1 {
		t.Fatalf("read: %+v %v", r, err)
	}

	out, r, err := Remove(cur, "ghcr.io")
	if err != nil || string(out) != `{"auths":{"quay.io":{"auth":"`+b64("q:pw")+`"}}}`+"\n" || r.After != "" || !r.Changed {
		t.Fatalf("remove: %s %+v %v", out, r, err)
	}

	if r, err := Read(nil, "ghcr.io"); err != nil || len(r.Before) != 0 {
		t.Fatalf("read of no file: %+v %v", r, err)
	}
}

func TestParseReport(t *testing.T) {
	r := Report{Path: "/var/lib/kubelet/config.json", Before: []string{"a"}, After: "b", Kept: 2, Changed: true}

	got, err := ParseReport(r.String() + "\n")
	if err != nil || got.String() != r.String() {
		t.Fatalf("%+v %v", got, err)
	}

	for _, bad := range []string{"", "written", `{"after":"b","password":"x"}`} {
		if _, err := ParseReport(bad); err == nil {
			t.Fatalf("%q read as a report", bad)
		}
	}
}
