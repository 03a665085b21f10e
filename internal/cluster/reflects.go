package cluster

import (
	"encoding/json"
	"reflect"
)

// Reflects reports whether obj already is what the JSON merge patch would make it: every value
// the patch sets is there, equal; every key it removes (null) is absent. It is how a write whose
// answer was lost is recognised as landed: the object shows it. (A field absent because its
// zero value is omitted equals a patch setting that zero value.)
func Reflects(obj any, patch map[string]any) bool {
	var o, p map[string]any
	if !normalise(obj, &o) || !normalise(patch, &p) {
		return false
	}

	return reflects(o, p)
}

func reflects(obj, patch map[string]any) bool {
	for k, want := range patch {
		got, has := obj[k]

		switch w := want.(type) {
		case nil:
			if has && got != nil {
				return false
			}
		case map[string]any:
			g, _ := got.(map[string]any)
			if !reflects(g, w) {
				return false
			}
		default:
			if !has && zero(want) {
				continue
			}

			if !reflect.DeepEqual(got, want) {
				return false
			}
		}
	}

	return true
}

// zero reports a JSON zero value: false, 0, "", an empty list.
func zero(v any) bool {
	switch x := v.(type) {
	case bool:
		return !x
	case float64:
		return x == 0
	case string:
		return x == ""
	case []any:
		return len(x) == 0
	}

	return false
}

// normalise turns v into the plain JSON form (maps, lists, float64s) both sides compare in.
func normalise(v any, out *map[string]any) bool {
	b, err := json.Marshal(v)

	return err == nil && json.Unmarshal(b, out) == nil
}
