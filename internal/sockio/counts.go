// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package sockio

// Counts counts what a socket holds open (connections, calls) in all and per key, for limits on both. The
// caller locks it.
type Counts[K comparable] struct {
	total int
	per   map[K]int
}

// Enter counts one more for key unless that would pass max in all or maxPer for the key; it returns the counts
// it found, and whether it entered.
func (c *Counts[K]) Enter(key K, max, maxPer int) (total, mine int, ok bool) {
	if c.per == nil {
		c.per = map[K]int{}
	}
	total, mine = c.total, c.per[key]
	if total >= max || mine >= maxPer {
		return total, mine, false
	}
	c.total++
	c.per[key]++
	return total, mine, true
}

// Leave uncounts one of key's.
func (c *Counts[K]) Leave(key K) {
	c.total--
	if c.per[key]--; c.per[key] <= 0 {
		delete(c.per, key)
	}
}

// Of is how many key holds.
func (c *Counts[K]) Of(key K) int { return c.per[key] }
