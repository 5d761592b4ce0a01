// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/client"
)

// One caller registering many regions at once meets the fd socket's limits (descriptors waiting per caller,
// connections per uid); the client backs off and retries inside its deadline, so every registration lands.
func TestConcurrentRegistrationsRetryFDLimits(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	c := dial(t, a)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 400
	mems := make([]*client.SharedMemory, n)
	for i := range mems {
		mems[i] = shm(t, 4096)
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed []error
	)
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if _, err := c.RegisterHost(ctx, mems[i].File, 0, 4096); err != nil {
				mu.Lock()
				failed = append(failed, err)
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("%d of %d concurrent registrations failed, first: %v", len(failed), n, failed[0])
	}
}
