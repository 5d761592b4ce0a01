// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
	"context"
	"sync"
)

// RunPlans runs every work item of a submission on its own goroutine, at most cap(slots) at once, and finishes
// each on t with exec's result. An item whose transfer ended (deadline, cancel) before it got a slot or before it
// started finishes with that error and never reaches exec. RunPlans returns when every item has finished.
func RunPlans(t *Tracker, work []Work, slots chan struct{}, exec func(context.Context, Work) error) {
	ctx := t.Context()
	var wg sync.WaitGroup
	for _, w := range work {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			t.Finish(w.Index, ctx.Err())
			continue
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			if err := ctx.Err(); err != nil {
				t.Finish(w.Index, err)
				return
			}
			t.Finish(w.Index, exec(ctx, w))
		}()
	}
	wg.Wait()
}
