"""Envoy's rate limit service asked by Python's grpcio, with stubs compiled
(grpcio-tools) from the protos the envoy-types crate ships.

  rls_client.py PROTO_DIR OUT_DIR ADDR N [CA_FILE]
      compiles envoy/service/ratelimit/v3/rls.proto and what it imports
      into OUT_DIR, then makes N ShouldRateLimit calls to ADDR for domain
      "edge", descriptor [remote_address=10.0.0.1]; one line per call:
      the overall code, the remaining count and the limit as
      name/requests_per_unit/unit. With CA_FILE, over TLS, trusting the
      certificates that CA signed. With RLS_TOKEN in the environment, each
      call carries `authorization: Bearer <RLS_TOKEN>`, as Envoy's
      `initial_metadata` sends it; with RLS_TRACEPARENT, a `traceparent`,
      as Envoy's tracing sends it. A call refused with a gRPC error prints
      ERROR and the status code's name.
"""
import os
import sys

from grpc_tools import protoc
import grpc_tools

RLS = "envoy/service/ratelimit/v3/rls.proto"


def compile_protos(proto_dir, out_dir):
    includes = [os.path.join(proto_dir, d) for d in sorted(os.listdir(proto_dir))]
    includes.append(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))
    flags = [f"-I{d}" for d in includes]
    descriptors = os.path.join(out_dir, "rls.pb")
    if protoc.main(["protoc", *flags, "--include_imports",
                    f"--descriptor_set_out={descriptors}", RLS]) != 0:
        sys.exit("protoc could not read " + RLS)
    from google.protobuf import descriptor_pb2
    files = descriptor_pb2.FileDescriptorSet()
    with open(descriptors, "rb") as f:
        files.ParseFromString(f.read())
    # The well-known types come with the protobuf package itself.
    names = [f.name for f in files.file if not f.name.startswith("google/protobuf/")]
    if protoc.main(["protoc", *flags, f"--python_out={out_dir}",
                    f"--grpc_python_out={out_dir}", *names]) != 0:
        sys.exit("protoc could not compile the stubs")


def main():
    proto_dir, out_dir, addr, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    ca_file = sys.argv[5] if len(sys.argv) > 5 else None
    compile_protos(proto_dir, out_dir)
    sys.path.insert(0, out_dir)
    import grpc
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
    from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2

    Entry = ratelimit_pb2.RateLimitDescriptor.Entry
    request = rls_pb2.RateLimitRequest(
        domain="edge",
        descriptors=[ratelimit_pb2.RateLimitDescriptor(
            entries=[Entry(key="remote_address", value="10.0.0.1")])],
    )
    Code = rls_pb2.RateLimitResponse.Code
    Unit = rls_pb2.RateLimitResponse.RateLimit.Unit
    if ca_file:
        with open(ca_file, "rb") as f:
            credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
        channel = grpc.secure_channel(addr, credentials)
    else:
        channel = grpc.insecure_channel(addr)
    token = os.environ.get("RLS_TOKEN")
    metadata = [("authorization", f"Bearer {token}")] if token else []
    # Envoy continues its trace in the call's metadata.
    traceparent = os.environ.get("RLS_TRACEPARENT")
    if traceparent:
        metadata.append(("traceparent", traceparent))
    metadata = metadata or None
    with channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        for _ in range(n):
            try:
                answer = stub.ShouldRateLimit(request, timeout=5, metadata=metadata)
            except grpc.RpcError as error:
                print(f"ERROR {error.code().name}", flush=True)
                continue
            status = answer.statuses[0]
            limit = status.current_limit
            print(f"{Code.Name(answer.overall_code)} remaining={status.limit_remaining} "
                  f"limit={limit.name}/{limit.requests_per_unit}/{Unit.Name(limit.unit)}",
                  flush=True)


if __name__ == "__main__":
    main()
