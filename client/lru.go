package client

import "container/list"

// lru is a map that keeps its size most recently used entries: a Put that
// would pass the size drops the least recently used one. Each entry costs
// a map slot and a list element besides its key and value. Not safe for
// concurrent use.
type lru[K comparable, V any] struct {
	size  int
	order *list.List // front: the most recently used; values are *lruEntry[K, V]
	byKey map[K]*list.Element
}

type lruEntry[K comparable, V any] struct {
	key   K
	value V
}

// newLRU returns an empty lru of size entries (at least 1).
func newLRU[K comparable, V any](size int) *lru[K, V] {
	return &lru[K, V]{size: max(size, 1), order: list.New(), byKey: make(map[K]*list.Element)}
}

// Get returns key's value and whether there is one, and marks it used.
func (c *lru[K, V]) Get(key K) (V, bool) {
	e, ok := c.byKey[key]
	if !ok {
		var zero V
		return zero, false
	}
	c.order.MoveToFront(e)
	return e.Value.(*lruEntry[K, V]).value, true
}

// Put sets key's value and marks it used, dropping the least recently
// used entry when the lru is full.
func (c *lru[K, V]) Put(key K, value V) {
	if e, ok := c.byKey[key]; ok {
		e.Value.(*lruEntry[K, V]).value = value
		c.order.MoveToFront(e)
		return
	}
	if c.order.Len() >= c.size {
		oldest := c.order.Back()
		c.order.Remove(oldest)
		delete(c.byKey, oldest.Value.(*lruEntry[K, V]).key)
	}
	c.byKey[key] = c.order.PushFront(&lruEntry[K, V]{key: key, value: value})
}

// Len returns the number of entries held.
func (c *lru[K, V]) Len() int { return c.order.Len() }
