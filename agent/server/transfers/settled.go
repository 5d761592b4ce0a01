// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package transfers

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
)

// maxFinished bounds how many settled transfers are kept for Wait, whatever their age: those among the agent's
// last maxFinished submissions (a power of two).
const maxFinished = 1 << 16

// settledChunk is how many records are allocated at once: an agent that made few transfers holds few.
const settledChunk = 1 << 12

// settledRecord is what Wait, Cancel and Watch need of a settled transfer. A success, nearly every transfer,
// is kept as these few words; a failure's status (its tags' messages) is kept whole beside them.
type settledRecord struct {
	id      uint64 // 0: the slot is empty
	owner   string // shares the caller's key string: no allocation
	bytes   uint64
	elapsed time.Duration
	ended   time.Duration // since the ring's epoch (monotonic)
	state   agentv1.TransferState
}

// settledRing keeps settled transfers in slot id mod maxFinished (the low bits of the id: its count within the
// agent's epoch, which fills the high bits; a record answers only its own whole id, so an id of another epoch
// finds nothing): a lookup is one index, a settlement one store, and nothing sweeps it. A record leaves when a
// newer transfer of its caller's takes its slot, when another caller's transfer (newer or older) does, which it
// may only while the record's caller holds more records than its own, or, on lookup, once it is older than the
// retention: one caller's flood of transfers pushes out its own records and those of callers busier than it,
// never a quieter caller's. Its records hold no pointer but the owner's key, so the collector
// has next to nothing to mark however busy the caller is; it lives under the table's lock.
type settledRing struct {
	epoch     time.Time
	retention time.Duration
	chunks    [maxFinished / settledChunk]*[settledChunk]settledRecord
	failed    map[uint64]*agentv1.TransferStatus
	held      map[string]int // how many records each caller holds (only callers holding some)
}

func newSettledRing(retention time.Duration) settledRing {
	return settledRing{epoch: time.Now(), retention: retention, failed: map[uint64]*agentv1.TransferStatus{},
		held: map[string]int{}}
}

// slot returns id's record, allocating its chunk when alloc is set (else nil where none is allocated yet: a
// lookup of ids never submitted allocates nothing).
func (r *settledRing) slot(id uint64, alloc bool) *settledRecord {
	i := id & (maxFinished - 1)
	c := r.chunks[i/settledChunk]
	if c == nil {
		if !alloc {
			return nil
		}
		c = new([settledChunk]settledRecord)
		r.chunks[i/settledChunk] = c
	}
	return &c[i%settledChunk]
}

// put records st, the status of the owner's transfer, settled at now. It is not kept when its slot holds a newer
// transfer of the owner's (it settled after maxFinished newer ones were submitted), or another caller's record,
// newer or older, within the retention while that caller holds no more records than the owner: a quiet caller's
// long transfer that settles after a busier caller's flood went round the ring is kept, and answers its Wait.
func (r *settledRing) put(owner string, st *agentv1.TransferStatus, now time.Time) {
	rec := r.slot(st.TransferId, true)
	switch {
	case rec.id == 0:
	case rec.owner == owner:
		if rec.id > st.TransferId {
			return
		}
	case !r.expired(rec, now) && r.held[rec.owner] <= r.held[owner]:
		return
	}
	r.clear(rec)
	*rec = settledRecord{id: st.TransferId, owner: owner, bytes: st.Bytes, elapsed: st.Elapsed.AsDuration(),
		ended: now.Sub(r.epoch), state: st.State}
	r.held[owner]++
	if st.State != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED {
		r.failed[st.TransferId] = st
	}
}

// expired reports whether rec settled longer than the retention before now.
func (r *settledRing) expired(rec *settledRecord, now time.Time) bool {
	return now.Sub(r.epoch)-rec.ended > r.retention
}

// get returns the status of the owner's settled transfer id, or nil when it is not kept (never settled, older
// than the retention, pushed out by newer ones, or another caller's).
func (r *settledRing) get(owner string, id uint64, now time.Time) *agentv1.TransferStatus {
	if id == 0 {
		return nil
	}
	rec := r.slot(id, false)
	if rec == nil || rec.id != id || rec.owner != owner {
		return nil
	}
	if r.expired(rec, now) {
		r.clear(rec)
		return nil
	}
	if st := r.failed[id]; st != nil {
		return st
	}
	return &agentv1.TransferStatus{TransferId: id, State: rec.state, Bytes: rec.bytes, Elapsed: durationpb.New(rec.elapsed)}
}

// clear empties rec's slot, and forgets the failure status kept beside it.
func (r *settledRing) clear(rec *settledRecord) {
	if rec.id == 0 {
		return
	}
	if rec.state != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED {
		delete(r.failed, rec.id)
	}
	if r.held[rec.owner]--; r.held[rec.owner] <= 0 {
		delete(r.held, rec.owner)
	}
	*rec = settledRecord{}
}
