"""A real HTTP/2 client (the h2 package, with its HPACK decoder) that tells
how each response header was encoded, for the end-to-end tests.

  h2_headers.py ADDR PATH COUNT   COUNT GETs of PATH, one after another on
                                  one h2c connection (prior knowledge) to
                                  ADDR (host:port); for each response, one
                                  line: its status, then each header as
                                  NAME=never (sent never indexed) or
                                  NAME=indexable
"""
import socket
import sys

import h2.config
import h2.connection
import h2.events
from hpack import NeverIndexedHeaderTuple


def main(addr, path, count):
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    for _ in range(count):
        stream = conn.get_next_available_stream_id()
        conn.send_headers(
            stream,
            [(":method", "GET"), (":scheme", "http"), (":authority", addr), (":path", path)],
            end_stream=True,
        )
        sock.sendall(conn.data_to_send())
        line, done = None, False
        while not done:
            data = sock.recv(65536)
            if not data:
                print("closed", flush=True)
                return
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream:
                    status = ""
                    fields = []
                    for header in event.headers:
                        name, value = header[0].decode(), header[1].decode()
                        if name == ":status":
                            status = value
                            continue
                        kind = "never" if isinstance(header, NeverIndexedHeaderTuple) else "indexable"
                        fields.append(f"{name}={kind}")
                    line = " ".join([status] + fields)
                elif isinstance(event, h2.events.StreamEnded) and event.stream_id == stream:
                    done = True
                elif isinstance(event, h2.events.StreamReset) and event.stream_id == stream:
                    line, done = "reset", True
            sock.sendall(conn.data_to_send())
        print(line, flush=True)
    conn.close_connection()
    sock.sendall(conn.data_to_send())
    sock.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
