"""A real WebSocket echo server and client (the websockets package), for the
end-to-end tests.

  ws_echo.py serve PORT            echo server on 127.0.0.1:PORT; prints "ready"
  ws_echo.py talk URL QUIET_S...   connects, then for each QUIET_S: stays silent
                                   that many seconds, sends a message and prints
                                   "echo" when it comes back, or "closed" and
                                   stops when the connection is gone
"""
import asyncio
import sys

import websockets


async def serve(port):
    async def echo(ws):
        async for message in ws:
            await ws.send(message)

    async with websockets.serve(echo, "127.0.0.1", port, ping_interval=None):
        print("ready", flush=True)
        await asyncio.sleep(120)


async def talk(url, quiet):
    async with websockets.connect(url, ping_interval=None, close_timeout=1) as ws:
        for seconds in quiet:
            await asyncio.sleep(seconds)
            try:
                await ws.send("hello")
                reply = await asyncio.wait_for(ws.recv(), timeout=5)
                print("echo" if reply == "hello" else "wrong", flush=True)
            except (websockets.ConnectionClosed, asyncio.TimeoutError):
                print("closed", flush=True)
                return


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        asyncio.run(serve(int(sys.argv[2])))
    else:
        asyncio.run(talk(sys.argv[2], [float(s) for s in sys.argv[3:]]))
