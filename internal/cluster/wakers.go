package cluster

import (
	"slices"
	"sync"
)

// wakers are the waits on a watch's objects, by name: each is signalled, best effort, when the
// watch sees its object (or, for a probe pod, its Events) change. The Node watch and the probe
// watch each keep one.
type wakers struct {
	mu sync.Mutex
	m  map[string][]chan struct{}
}

// add registers a wait on name; stop unregisters it.
func (w *wakers) add(name string) (ch <-chan struct{}, stop func()) {
	c := make(chan struct{}, 1)

	w.mu.Lock()
	if w.m == nil {
		w.m = map[string][]chan struct{}{}
	}

	w.m[name] = append(w.m[name], c)
	w.mu.Unlock()

	return c, func() {
		w.mu.Lock()
		defer w.mu.Unlock()

		w.m[name] = slices.DeleteFunc(w.m[name], func(x chan struct{}) bool { return x == c })
		if len(w.m[name]) == 0 {
			delete(w.m, name)
		}
	}
}

// wake signals every wait on name; one pending signal each is enough.
func (w *wakers) wake(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()

	for _, c := range w.m[name] {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}
