"""The official OpenAI and Anthropic Python SDKs against floodgate.

    sdks.py upstream PORT        an upstream answering both providers' wire
                                 formats (JSON), counting what it answers
    sdks.py refused URL          a call refused by floodgate: the SDK's own
                                 rate-limit error, with the retry time
    sdks.py retried URL          calls whose 429 the SDK waits out and
                                 retries by itself

The client modes print one JSON line of what they saw.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

OPENAI_ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "gpt-4o",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hello"},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
}

ANTHROPIC_ANSWER = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "content": [{"type": "text", "text": "hello"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 12, "output_tokens": 5},
}


class Upstream(BaseHTTPRequestHandler):
    answered = 0
    lock = threading.Lock()

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        self.rfile.read(length)
        with Upstream.lock:
            Upstream.answered += 1
        if self.path.endswith("/chat/completions"):
            body = OPENAI_ANSWER
        elif self.path.endswith("/messages"):
            body = ANTHROPIC_ANSWER
        else:
            self.send_response(404)
            self.end_headers()
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        # How many calls were answered, for the test.
        data = str(Upstream.answered).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def clients(url, retries):
    import anthropic
    import openai

    return (
        openai.OpenAI(base_url=url + "/v1", api_key="sk-test-key", max_retries=retries),
        anthropic.Anthropic(base_url=url, api_key="sk-ant-test-key", max_retries=retries),
    )


def ask_openai(client):
    return client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
    )


def ask_anthropic(client):
    return client.messages.create(
        model="claude-sonnet-4-5",
        max_tokens=64,
        messages=[{"role": "user", "content": "hi"}],
    )


def refused(url):
    import anthropic
    import openai

    oa, an = clients(url, 0)
    seen = {}
    for name, ask, client, error in [
        ("openai", ask_openai, oa, openai.RateLimitError),
        ("anthropic", ask_anthropic, an, anthropic.RateLimitError),
    ]:
        ask(client)
        try:
            ask(client)
            seen[name] = {"raised": None}
        except error as e:
            seen[name] = {
                "raised": type(e).__name__,
                "status": e.status_code,
                "retry_after_ms": e.response.headers.get("retry-after-ms"),
                "retry_after": e.response.headers.get("retry-after"),
                "body": e.body,
            }
    print(json.dumps(seen))


def retried(url):
    oa, an = clients(url, 3)
    answers = [ask_openai(oa).choices[0].message.content for _ in range(2)]
    answers += [ask_anthropic(an).content[0].text for _ in range(2)]
    print(json.dumps({"answers": answers}))


if __name__ == "__main__":
    mode, arg = sys.argv[1], sys.argv[2]
    if mode == "upstream":
        ThreadingHTTPServer(("127.0.0.1", int(arg)), Upstream).serve_forever()
    elif mode == "refused":
        refused(arg)
    elif mode == "retried":
        retried(arg)
    else:
        sys.exit(f"unknown mode {mode}")
