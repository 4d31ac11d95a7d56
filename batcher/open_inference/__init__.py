"""The Open Inference Protocol's gRPC service: its proto and the modules grpcio-tools generates
from it (scripts/gen-open-inference)."""
