package pool

import (
	"sync"
	"testing"
)

// Each runs every index once, never more than k at a time, started in order.
func TestEach(t *testing.T) {
	for _, tc := range []struct {
		name string
		n, k int
	}{
		{"none", 0, 3}, {"one at a time", 5, 1}, {"three at a time", 20, 3}, {"more places than work", 3, 10}, {"k below one runs one", 4, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var (
				mu            sync.Mutex
				running, peak int
				started       []int
				ran           = make([]int, tc.n)
			)

			Each(tc.n, tc.k, func(i int) {
				mu.Lock()
				running++
				peak = max(peak, running)
				started = append(started, i)
				ran[i]++
				mu.Unlock()

				mu.Lock()
				running--
				mu.Unlock()
			})

			for i, c := range ran {
				if c != 1 {
					t.Fatalf("index %d ran %d times", i, c)
				}
			}

			if limit := max(tc.k, 1); peak > limit {
				t.Fatalf("%d ran at once, the bound is %d", peak, limit)
			}

			if tc.k <= 1 {
				for i, s := range started {
					if s != i {
						t.Fatalf("one at a time, started %v: not in order", started)
					}
				}
			}
		})
	}
}
