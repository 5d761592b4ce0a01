# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Python client of the fabricxfer agent's sidecar socket (see fabricxfer.client)."""

__version__ = "0.1.0"

from fabricxfer.client import (AgentDeadlineExceeded, AgentError, AgentUnreachable, Client, ClientClosed,  # noqa: E402
                               DeadlineExceeded,
                               FdSocketError, Item, Layout, PoolSlice, PreparedBlocks, Region,
                               Remote, RemoteLayout, SessionLost, TransferFailed, default_socket, get_fd, put_fd, shared_memory,
                               to_descriptor, to_layout, to_layout_segment, to_region, to_segment, transfer_status)
from fabricxfer.cuda import CudaShare, parse_cuda_share  # noqa: E402

__all__ = ["AgentDeadlineExceeded", "AgentError", "AgentUnreachable", "Client", "ClientClosed", "CudaShare", "DeadlineExceeded", "FdSocketError", "Item", "Layout", "PoolSlice", "PreparedBlocks", "Region", "Remote",
           "RemoteLayout", "SessionLost", "TransferFailed", "default_socket", "get_fd", "parse_cuda_share", "put_fd", "shared_memory",
           "to_descriptor", "to_layout", "to_layout_segment", "to_region", "to_segment", "transfer_status"]
