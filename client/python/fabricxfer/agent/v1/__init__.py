"""Generated stubs of fabricxfer.agent.v1 (hack/gen-proto.sh): agent_pb2, agent_pb2_grpc."""
