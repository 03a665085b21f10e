package state

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadLocal(t *testing.T) {
	dir := t.TempDir()

	s, err := ReadLocal(filepath.Join(dir, "absent.json"))
	if err != nil || s.Lineage != "" || s.Serial != 0 {
		t.Fatalf("missing file: %+v %v", s, err)
	}

	for name, content := range map[string]string{"corrupt": "{not json", "future": `{"format_version":"9"}`} {
		p := filepath.Join(dir, name)
		_ = os.WriteFile(p, []byte(content), 0o600)

		if _, err := ReadLocal(p); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: %v", name, err)
		}
	}

	p := filepath.Join(dir, "ok.json")
	_ = os.WriteFile(p, []byte(`{"format_version":"1","lineage":"l","serial":3,"records":[{"node":"a","phase":"drained"},{"node":"b","phase":"released"}]}`), 0o600)

	s, err = ReadLocal(p)
	if err != nil || s.Serial != 3 || s.Records[0].Terminal() || !s.Records[1].Terminal() {
		t.Fatalf("%+v %v", s, err)
	}
}
