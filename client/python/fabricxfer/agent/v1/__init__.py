# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Generated stubs of fabricxfer.agent.v1 (hack/gen-proto.sh): agent_pb2, agent_pb2_grpc."""
