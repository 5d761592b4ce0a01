// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
	"context"
	"sync"
)

// RunPlans runs every work item of a submission on its own goroutine, as slots allow (in turns between the
// transfers' shares), and finishes each on t with exec's result. An item whose transfer ended (deadline, cancel)
// before it got a slot or before it started finishes with that error and never reaches exec. RunPlans returns when
// every item has finished.
func RunPlans(t *Tracker, work []Work, slots *Slots, exec func(context.Context, Work) error) {
	ctx := t.Context()
	var wg sync.WaitGroup
	for _, w := range work {
		if err := slots.Take(ctx, t.share); err != nil {
			t.Finish(w.Index, err)
			continue
		}
		wg.Add(1)
		go func() {
			defer func() { slots.Give(); wg.Done() }()
			if err := ctx.Err(); err != nil {
				t.Finish(w.Index, err)
				return
			}
			t.Finish(w.Index, exec(ctx, w))
		}()
	}
	wg.Wait()
}
