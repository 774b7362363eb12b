"""A real gRPC server and client (grpcio), for the end-to-end tests.

  grpc_echo.py serve PORT      an insecure (h2c) server on 127.0.0.1:PORT whose
                               method /echo.Echo/Say returns the request bytes;
                               prints "ready" once listening
  grpc_echo.py call ADDR N     N unary calls to ADDR through one channel; one
                               line per call: the status code name and details
"""
import sys
from concurrent import futures

import grpc


def serve(port):
    def say(request, context):
        return request

    handler = grpc.method_handlers_generic_handler(
        "echo.Echo", {"Say": grpc.unary_unary_rpc_method_handler(say)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination(timeout=120)


def call(addr, n):
    with grpc.insecure_channel(addr) as channel:
        say = channel.unary_unary("/echo.Echo/Say")
        for i in range(n):
            try:
                reply = say(b"hello %d" % i, timeout=10)
                print("OK", reply.decode(), flush=True)
            except grpc.RpcError as e:
                print(e.code().name, e.details(), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        call(sys.argv[2], int(sys.argv[3]))
