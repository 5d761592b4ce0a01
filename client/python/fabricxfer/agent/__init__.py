"""Generated stubs of the agent protos (hack/gen-proto.sh)."""
