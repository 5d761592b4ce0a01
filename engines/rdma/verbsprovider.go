// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package rdma

import (
	"github.com/fabricxfer/fabricxfer/engines/verbs"
)

// VerbsProvider is the Provider over libibverbs.
func VerbsProvider(lib *verbs.Lib) Provider { return verbsProvider{lib} }

type verbsProvider struct{ lib *verbs.Lib }

func (p verbsProvider) Open(name string, port int) (Device, error) {
	d, err := p.lib.OpenDevice(name, port)
	if err != nil {
		return nil, err
	}
	return verbsDevice{d}, nil
}

type verbsDevice struct{ d *verbs.Device }

func (v verbsDevice) RegisterDMABuf(fd int, offset, length, iova uint64, access verbs.Access) (MR, error) {
	mr, err := v.d.RegisterDMABuf(fd, offset, length, iova, access)
	if err != nil {
		return nil, err
	}
	return mr, nil
}

func (v verbsDevice) RegisterMemory(addr, length uint64, access verbs.Access) (MR, error) {
	mr, err := v.d.RegisterMemory(addr, length, access)
	if err != nil {
		return nil, err
	}
	return mr, nil
}

func (v verbsDevice) CreateQP(depth int) (QP, error) {
	qp, err := v.d.CreateQP(depth)
	if err != nil {
		return nil, err
	}
	return qp, nil
}

func (v verbsDevice) Close() error { return v.d.Close() }
