package config

import (
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"
)

// The reference table in docs/config.md lists exactly the attributes the decoder accepts, each
// with the right "required": the table cannot drift from the code.
func TestReferenceMatchesTheDecoder(t *testing.T) {
	want := map[string]bool{} // attribute -> required
	walk(reflect.TypeOf(file{}), "", want)

	doc, err := os.ReadFile("../../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}

	got := map[string]bool{}

	for _, line := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}

		cells := strings.Split(line, "|")
		name := strings.TrimSpace(cells[1])
		name = strings.Trim(strings.TrimSuffix(name, " (label)"), "`")
		got[name] = strings.HasPrefix(strings.TrimSpace(cells[4]), "yes")
	}

	var problems []string

	for name, req := range want {
		if r, ok := got[name]; !ok {
			problems = append(problems, name+": missing from docs/config.md")
		} else if r != req {
			problems = append(problems, name+": required is "+yesNo(req)+" in the decoder, "+yesNo(r)+" in the docs")
		}
	}

	for name := range got {
		if _, ok := want[name]; !ok {
			problems = append(problems, name+": in docs/config.md but not accepted by the decoder")
		}
	}

	sort.Strings(problems)

	if len(problems) > 0 || len(want) < 40 {
		t.Fatalf("docs/config.md's reference and the decoder (%d attributes) disagree:\n%s", len(want), strings.Join(problems, "\n"))
	}
}

// walk lists a block struct's attributes as block.attr (labels as block.<label>), recursing
// into nested blocks.
func walk(t reflect.Type, prefix string, out map[string]bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)

		tag := f.Tag.Get("hcl")
		if tag == "" {
			continue
		}

		name, kind, _ := strings.Cut(tag, ",")

		switch kind {
		case "block":
			bt := f.Type
			for bt.Kind() == reflect.Pointer || bt.Kind() == reflect.Slice {
				bt = bt.Elem()
			}

			walk(bt, prefix+name+".", out)
		case "label":
			out[strings.TrimSuffix(prefix, ".")+".<"+name+">"] = true
		default:
			out[prefix+name] = kind != "optional"
		}
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}

	return "no"
}
