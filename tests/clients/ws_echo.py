"""A real WebSocket echo server and client (the websockets package), for the
end-to-end tests.

  ws_echo.py serve PORT            echo server on 127.0.0.1:PORT; prints "ready"
  ws_echo.py talk URL QUIET_S...   connects, then for each QUIET_S: stays silent
                                   that many seconds, sends a message and prints
                                   "echo" when it comes back, or "closed" and
                                   stops when the connection is gone; a last
                                   QUIET_S of "close" stays silent until the
                                   other side closes (at most 10 s) and prints
                                   "closed after SECONDS", or "open"; prints
                                   "refused" when the handshake is answered
                                   with anything but 101
"""
import asyncio
import sys
import time

import websockets


async def serve(port):
    async def echo(ws):
        async for message in ws:
            await ws.send(message)

    async with websockets.serve(echo, "127.0.0.1", port, ping_interval=None):
        print("ready", flush=True)
        await asyncio.sleep(120)


async def talk(url, quiet):
    try:
        ws = await websockets.connect(url, ping_interval=None, close_timeout=1)
    except websockets.exceptions.InvalidHandshake:
        print("refused", flush=True)
        return
    async with ws:
        silent_since = time.monotonic()
        for seconds in quiet:
            if seconds == "close":
                try:
                    await asyncio.wait_for(ws.recv(), timeout=10)
                    print("spoke", flush=True)
                except websockets.ConnectionClosed:
                    print("closed after %.3f" % (time.monotonic() - silent_since), flush=True)
                except asyncio.TimeoutError:
                    print("open", flush=True)
                return
            await asyncio.sleep(float(seconds))
            try:
                await ws.send("hello")
                reply = await asyncio.wait_for(ws.recv(), timeout=5)
                silent_since = time.monotonic()
                print("echo" if reply == "hello" else "wrong", flush=True)
            except (websockets.ConnectionClosed, asyncio.TimeoutError):
                print("closed", flush=True)
                return


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        asyncio.run(serve(int(sys.argv[2])))
    else:
        asyncio.run(talk(sys.argv[2], sys.argv[3:]))
