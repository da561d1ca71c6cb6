"""The inference protocol's gRPC messages, from the checked-in descriptor of grpc_predict_v2.proto.

The descriptor is loaded into a descriptor pool of calibd's own, not protobuf's default one:
tritonclient, MLServer and the kserve SDK define the same ``inference.*`` names in the default
pool, and a process (a test, an embedder) may import them beside calibd.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

DESCRIPTOR_FILE = Path(__file__).with_name("grpc_predict_v2.pb")
SERVICE = "inference.GRPCInferenceService"

POOL = descriptor_pool.DescriptorPool()
for _file in descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR_FILE.read_bytes()).file:
    POOL.Add(_file)


def _message(name: str):
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(f"inference.{name}"))


ServerLiveRequest = _message("ServerLiveRequest")
ServerLiveResponse = _message("ServerLiveResponse")
ServerReadyRequest = _message("ServerReadyRequest")
ServerReadyResponse = _message("ServerReadyResponse")
ModelReadyRequest = _message("ModelReadyRequest")
ModelReadyResponse = _message("ModelReadyResponse")
ServerMetadataRequest = _message("ServerMetadataRequest")
ServerMetadataResponse = _message("ServerMetadataResponse")
ModelMetadataRequest = _message("ModelMetadataRequest")
ModelMetadataResponse = _message("ModelMetadataResponse")
ModelInferRequest = _message("ModelInferRequest")
ModelInferResponse = _message("ModelInferResponse")
InferParameter = _message("InferParameter")
