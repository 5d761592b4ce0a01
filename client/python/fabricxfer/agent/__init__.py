# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Generated stubs of the agent protos (hack/gen-proto.sh)."""
