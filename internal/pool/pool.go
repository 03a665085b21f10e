// Package pool runs work at most k at a time: the one bounded-parallel loop (the executor's
// nodes, the plan's Talos dry runs, the fleet's Talos reads).
package pool

import "sync"

// Each runs do(0) … do(n-1), at most k at once (at least one), each started in order once a
// place is free, and waits for all.
func Each(n, k int, do func(i int)) {
	sem := make(chan struct{}, max(k, 1))

	var wg sync.WaitGroup

	for i := range n {
		sem <- struct{}{}

		wg.Add(1)

		go func() {
			defer wg.Done()
			defer func() { <-sem }()

			do(i)
		}()
	}

	wg.Wait()
}
