// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package transfers

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
)

func succeeded(id, bytes uint64) *agentv1.TransferStatus {
	return &agentv1.TransferStatus{TransferId: id, State: agentv1.TransferState_TRANSFER_STATE_SUCCEEDED, Bytes: bytes,
		Elapsed: durationpb.New(time.Duration(id) * time.Microsecond)}
}

func failed(id uint64) *agentv1.TransferStatus {
	return &agentv1.TransferStatus{TransferId: id, State: agentv1.TransferState_TRANSFER_STATE_FAILED, Error: "peer gone",
		Failures: []*agentv1.TagFailure{{Tag: "kv", Code: "Unavailable", Message: "peer gone"}}}
}

func TestSettledRingAnswersItsOwnerOnly(t *testing.T) {
	r := newSettledRing(time.Minute)
	now := r.epoch.Add(time.Second)
	r.put("pod-a", succeeded(7, 4096), now)
	st := r.get("pod-a", 7, now)
	if st == nil || st.TransferId != 7 || st.State != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED || st.Bytes != 4096 ||
		st.Elapsed.AsDuration() != 7*time.Microsecond {
		t.Fatalf("the owner's lookup: %v", st)
	}
	if st := r.get("pod-b", 7, now); st != nil {
		t.Fatalf("another caller saw transfer 7: %v", st)
	}
	for _, id := range []uint64{0, 6, 8, 7 + maxFinished} {
		if st := r.get("pod-a", id, now); st != nil {
			t.Fatalf("transfer %d was never settled, got %v", id, st)
		}
	}
}

func TestSettledRingForgetsByAgeAndByNewerTransfers(t *testing.T) {
	r := newSettledRing(time.Minute)
	t0 := r.epoch.Add(time.Second)
	r.put("pod-a", succeeded(1, 1), t0)
	r.put("pod-a", failed(2), t0)
	if r.get("pod-a", 1, t0.Add(59*time.Second)) == nil {
		t.Fatal("transfer 1 was forgotten within the retention")
	}
	if st := r.get("pod-a", 2, t0.Add(59*time.Second)); st == nil || len(st.Failures) != 1 || st.Failures[0].Tag != "kv" {
		t.Fatalf("a failed transfer's status is kept whole: %v", st)
	}
	if st := r.get("pod-a", 1, t0.Add(61*time.Second)); st != nil {
		t.Fatalf("transfer 1 outlived the retention: %v", st)
	}
	if st := r.get("pod-a", 2, t0.Add(61*time.Second)); st != nil || len(r.failed) != 0 {
		t.Fatalf("failed transfer 2 outlived the retention: %v (%d failures kept)", st, len(r.failed))
	}

	// The slot of a transfer is taken by the one maxFinished later; that one's failure status leaves with it.
	r.put("pod-a", failed(3), t0)
	r.put("pod-b", succeeded(3+maxFinished, 9), t0)
	if st := r.get("pod-a", 3, t0); st != nil || len(r.failed) != 0 {
		t.Fatalf("transfer 3 is still answered after a newer one took its slot: %v (%d failures kept)", st, len(r.failed))
	}
	if st := r.get("pod-b", 3+maxFinished, t0); st == nil || st.Bytes != 9 {
		t.Fatalf("the newer transfer: %v", st)
	}
	// An older transfer settling late does not push out a newer one of a caller no busier than its own (one
	// busier gives way: TestSettledRingKeepsAQuietCallersRecordsThroughAFlood).
	r.put("pod-a", succeeded(4, 1), t0)
	r.put("pod-a", succeeded(3, 1), t0)
	if st := r.get("pod-b", 3+maxFinished, t0); st == nil {
		t.Fatal("a transfer that settled late pushed out a newer one")
	}
	if st := r.get("pod-a", 3, t0); st != nil {
		t.Fatalf("a transfer settled after %d newer ones is kept: %v", maxFinished, st)
	}
}

// A lookup of ids nobody submitted allocates nothing: any caller may ask for any id.
func TestSettledRingLookupsAllocateNothing(t *testing.T) {
	r := newSettledRing(time.Minute)
	now := r.epoch
	r.put("pod-a", succeeded(1, 1), now)
	id := uint64(1)
	allocs := testing.AllocsPerRun(1000, func() {
		id += 4099
		_ = r.get("pod-b", id, now)
	})
	if allocs != 0 {
		t.Fatalf("a lookup of an unknown id allocated %.1f times", allocs)
	}
	chunks := 0
	for _, c := range r.chunks {
		if c != nil {
			chunks++
		}
	}
	if chunks != 1 {
		t.Fatalf("%d chunks allocated after one settled transfer and lookups of others, want 1", chunks)
	}
}

// Recording a settled success allocates nothing once its chunk exists: the busiest caller adds no work for the
// collector by settling transfers.
func TestSettledRingRecordsSuccessesWithoutAllocating(t *testing.T) {
	r := newSettledRing(time.Minute)
	now := r.epoch
	st := succeeded(1, 1)
	r.put("pod-a", st, now)
	allocs := testing.AllocsPerRun(1000, func() {
		st.TransferId += maxFinished // the same slot
		r.put("pod-a", st, now)
	})
	if allocs != 0 {
		t.Fatalf("recording a success allocated %.1f times", allocs)
	}
}

// A caller's flood of transfers pushes out its own settled records, never those of a quieter caller: any local
// process may submit as many transfers as its limits allow, and another tenant's statuses must stay answerable.
func TestSettledRingKeepsAQuietCallersRecordsThroughAFlood(t *testing.T) {
	r := newSettledRing(time.Minute)
	now := r.epoch.Add(time.Second)
	for id := uint64(1); id <= 10; id++ {
		r.put("pod-a", succeeded(id, id), now)
	}
	r.put("pod-a", failed(11), now)
	const flood = 3 * maxFinished
	for id := uint64(12); id < 12+flood; id++ {
		r.put("pod-b", succeeded(id, 1), now)
	}
	for id := uint64(1); id <= 10; id++ {
		if st := r.get("pod-a", id, now); st == nil || st.Bytes != id {
			t.Fatalf("pod-a's transfer %d after pod-b's %d transfers: %v", id, flood, st)
		}
	}
	if st := r.get("pod-a", 11, now); st == nil || len(st.Failures) != 1 || st.Failures[0].Message != "peer gone" {
		t.Fatalf("pod-a's failed transfer 11 after the flood: %v", st)
	}
	if r.held["pod-a"] != 11 || r.held["pod-b"] != maxFinished-11 {
		t.Fatalf("records held: pod-a %d, pod-b %d; want 11 and %d", r.held["pod-a"], r.held["pod-b"], maxFinished-11)
	}
	if st := r.get("pod-b", 100+2*maxFinished, now); st == nil {
		t.Fatal("the flood's last round is not kept")
	}
	// The flood's transfers that fell on pod-a's slots were not kept.
	if st := r.get("pod-b", 5+2*maxFinished, now); st != nil {
		t.Fatalf("pod-b's transfer took pod-a's slot: %v", st)
	}
	// A quiet caller's newer transfer takes a slot from the busier one (the flood's last id fell in pod-a's slot
	// 11; the next slot is pod-b's).
	last := uint64(12 + flood - 1)
	r.put("pod-c", succeeded(last+1, 3), now)
	if st := r.get("pod-c", last+1, now); st == nil || st.Bytes != 3 {
		t.Fatalf("pod-c's transfer beside the flood: %v", st)
	}
	if st := r.get("pod-b", last+1-maxFinished, now); st != nil {
		t.Fatalf("the busier caller's record in pod-c's slot is still answered: %v", st)
	}
	// A quiet caller's transfer that settles after the flood went round the ring (it ran while maxFinished newer
	// ones were submitted) takes its slot from the busier caller's newer record: it was dropped, and its Wait
	// answered NotFound though its bytes had landed.
	long := last + 2 - 3*maxFinished
	r.put("pod-d", succeeded(long, 32<<20), now)
	if st := r.get("pod-d", long, now); st == nil || st.Bytes != 32<<20 {
		t.Fatalf("pod-d's long transfer that settled after pod-b's flood: %v", st)
	}
	if st := r.get("pod-b", long+3*maxFinished, now); st != nil {
		t.Fatalf("the busier caller's newer record in pod-d's slot is still answered: %v", st)
	}
	// The owner's newer record takes the slot, and its older one does not take it back.
	r.put("pod-d", succeeded(long+maxFinished, 1), now)
	r.put("pod-d", succeeded(long, 2), now)
	if st := r.get("pod-d", long+maxFinished, now); st == nil || st.Bytes != 1 {
		t.Fatalf("pod-d's newer transfer after its older one settled again: %v", st)
	}
	// Past the retention, pod-a's records give way to anyone.
	later := now.Add(61 * time.Second)
	r.put("pod-b", succeeded(1+4*maxFinished, 7), later)
	if st := r.get("pod-b", 1+4*maxFinished, later); st == nil || st.Bytes != 7 {
		t.Fatalf("pod-b's transfer in the slot of pod-a's expired record: %v", st)
	}
	if st := r.get("pod-a", 1, later); st != nil {
		t.Fatalf("pod-a's expired record is answered: %v", st)
	}
}

// Transfer ids carry the agent's epoch in their high 32 bits: the ring indexes them by their low bits (the count),
// and answers an id of another epoch that falls in the same slot with nothing, never the record kept there.
func TestSettledRingTellsEpochsApart(t *testing.T) {
	const epoch, other = uint64(0x9e3779b9) << 32, uint64(0x7f4a7c15) << 32
	r := newSettledRing(time.Minute)
	now := r.epoch.Add(time.Second)
	r.put("pod-a", succeeded(epoch+7, 4096), now)
	r.put("pod-a", failed(epoch+8), now)
	if st := r.get("pod-a", epoch+7, now); st == nil || st.TransferId != epoch+7 || st.Bytes != 4096 {
		t.Fatalf("the owner's lookup of an epoch's id: %v", st)
	}
	if st := r.get("pod-a", epoch+8, now); st == nil || len(st.Failures) != 1 {
		t.Fatalf("the owner's lookup of an epoch's failed id: %v", st)
	}
	for _, id := range []uint64{7, 8, other + 7, other + 8} {
		if st := r.get("pod-a", id, now); st != nil {
			t.Fatalf("id %#x of another epoch answered transfer %#x's status: %v", id, st.TransferId, st)
		}
	}
	// The slot is the count's: the epoch's transfer maxFinished later takes it.
	r.put("pod-a", succeeded(epoch+7+maxFinished, 1), now)
	if st := r.get("pod-a", epoch+7, now); st != nil {
		t.Fatalf("transfer %#x is still answered after a newer one took its slot: %v", epoch+7, st)
	}
	if st := r.get("pod-a", epoch+7+maxFinished, now); st == nil || st.Bytes != 1 {
		t.Fatalf("the newer transfer: %v", st)
	}
}
