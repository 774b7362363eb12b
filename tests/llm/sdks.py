"""The official OpenAI and Anthropic Python SDKs against floodgate.

    sdks.py upstream PORT        an upstream answering both providers' wire
                                 formats (JSON), counting what it answers
    sdks.py refused URL          a call refused by floodgate: the SDK's own
                                 rate-limit error, with the retry time
    sdks.py retried URL          calls whose 429 the SDK waits out and
                                 retries by itself
    sdks.py billed URL           each provider's JSON answer and stream,
                                 one without usage, one with a spoiled
                                 usage, one stream cut half-way
    sdks.py flood URL            60 calls at once, each hiding, spoiling
                                 or cutting its usage in turn
    sdks.py streams URL N        N streams at once of model "worst-case",
                                 each asking for 1,000 tokens at most
    sdks.py example URL          as a customer of examples/llm-gateway.toml
                                 (key demo-free-key): a gpt-4o stream that
                                 does not ask for usage, a gpt-4o-mini JSON
                                 call
    sdks.py per_model URL        three calls each to gpt-4o and gpt-4o-mini:
                                 which were answered, which refused
    sdks.py unasked URL DIRECT   OpenAI streams that do not ask for usage,
                                 through floodgate and straight to the
                                 upstream: the chunks the SDK yields and
                                 the raw bytes, each way

The upstream answers by the request's model: "no-usage" leaves the usage
out, "spoiled" reports a negative count, "cut" ends a stream's connection
half-way, "worst-case" streams slowly (0.3 s a chunk) and reports 20 prompt
tokens and all the completion tokens the request allowed. Its usages: OpenAI 12 + 5 (JSON), 31 + 9 (stream, when asked
for); Anthropic 12 + 5 (JSON), 44 + 12 (stream).

The client modes print one JSON line of what they saw.
"""

import json
import sys
import threading
import time
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


def openai_events(request):
    words = ["Hel", "lo", " there"]
    for word in words:
        yield {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": "gpt-4o",
            "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}],
            "usage": None,
        }
    if (request.get("stream_options") or {}).get("include_usage"):
        usage = {"prompt_tokens": 31, "completion_tokens": 9, "total_tokens": 40}
        if request.get("model") == "worst-case":
            most = request.get("max_completion_tokens") or request["max_tokens"]
            usage = {"prompt_tokens": 20, "completion_tokens": most, "total_tokens": 20 + most}
        yield {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": "gpt-4o",
            "choices": [],
            "usage": usage,
        }


def anthropic_events(request):
    yield "message_start", {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 44, "output_tokens": 1},
        },
    }
    yield "content_block_start", {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    for word in ["Hel", "lo"]:
        yield "content_block_delta", {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": word},
        }
    yield "content_block_stop", {"type": "content_block_stop", "index": 0}
    yield "message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": 12},
    }
    yield "message_stop", {"type": "message_stop"}


class Upstream(BaseHTTPRequestHandler):
    answered = 0
    lock = threading.Lock()
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        request = json.loads(self.rfile.read(length) or b"{}")
        with Upstream.lock:
            Upstream.answered += 1
        model = request.get("model", "")
        if self.path.endswith("/chat/completions"):
            body, events = dict(OPENAI_ANSWER), [("", e) for e in openai_events(request)]
        elif self.path.endswith("/messages"):
            body, events = dict(ANTHROPIC_ANSWER), list(anthropic_events(request))
        else:
            self.send_response(404)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        if model == "no-usage":
            body.pop("usage")
            for _, event in events:
                event.pop("usage", None)
                event.get("message", {}).pop("usage", None)
        if model == "spoiled":
            body["usage"] = {k: -5 for k in body["usage"]}
        if not request.get("stream"):
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        if model == "cut":
            events = events[: len(events) // 2]
        for name, event in events:
            text = (f"event: {name}\n" if name else "") + f"data: {json.dumps(event)}\n\n"
            data = text.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
            if model == "worst-case":
                # Long enough that every stream of a burst is in flight.
                time.sleep(0.3)
        if model == "cut":
            # The connection ends with the stream half sent.
            self.close_connection = True
            return
        if "/chat/completions" in self.path:
            data = b"data: [DONE]\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.write(b"0\r\n\r\n")

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


def billed(url):
    oa, an = clients(url, 0)
    seen = {}

    def attempt(name, call):
        try:
            seen[name] = call()
        except Exception as e:  # the cut stream: the SDK's own error
            seen[name] = "raised " + type(e).__name__

    attempt("openai json", lambda: ask_openai(oa).usage.total_tokens)

    def openai_stream(model, include_usage):
        options = {"include_usage": True} if include_usage else None
        stream = oa.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options=options,
        )
        return "".join(
            c.choices[0].delta.content or "" for c in stream if c.choices
        )

    attempt("openai stream", lambda: openai_stream("gpt-4o", True))
    attempt("openai stream without usage", lambda: openai_stream("gpt-4o", False))
    attempt("openai cut", lambda: openai_stream("cut", True))
    attempt(
        "openai no usage",
        lambda: oa.chat.completions.create(
            model="no-usage", messages=[{"role": "user", "content": "hi"}]
        ).choices[0].message.content,
    )
    attempt(
        "openai spoiled",
        lambda: oa.chat.completions.create(
            model="spoiled", messages=[{"role": "user", "content": "hi"}]
        ).choices[0].message.content,
    )
    attempt("anthropic json", lambda: ask_anthropic(an).usage.output_tokens)

    def anthropic_stream():
        with an.messages.stream(
            model="claude-sonnet-4-5",
            max_tokens=64,
            messages=[{"role": "user", "content": "hi"}],
        ) as stream:
            text = "".join(stream.text_stream)
            return [text, stream.get_final_message().usage.output_tokens]

    attempt("anthropic stream", anthropic_stream)
    print(json.dumps(seen))


def flood(url):
    from concurrent.futures import ThreadPoolExecutor

    oa, _ = clients(url, 0)
    models = ["spoiled", "no-usage", "cut"]

    def one(i):
        model = models[i % 3]
        try:
            if model == "cut":
                stream = oa.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": "hi"}],
                    stream=True,
                    stream_options={"include_usage": True},
                )
                for _ in stream:
                    pass
            else:
                oa.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "hi"}]
                )
            return model + " answered"
        except Exception as e:
            return model + " raised " + type(e).__name__

    with ThreadPoolExecutor(max_workers=60) as pool:
        outcomes = list(pool.map(one, range(60)))
    counts = {}
    for outcome in outcomes:
        counts[outcome] = counts.get(outcome, 0) + 1
    print(json.dumps(counts))


def streams(url, n):
    """n streams at once, each allowing 1,000 completion tokens."""
    from concurrent.futures import ThreadPoolExecutor

    import openai

    oa, _ = clients(url, 0)

    def one(_):
        try:
            stream = oa.chat.completions.create(
                model="worst-case",
                messages=[{"role": "user", "content": "write at length"}],
                max_tokens=1000,
                stream=True,
                stream_options={"include_usage": True},
            )
            usage = None
            for chunk in stream:
                usage = chunk.usage or usage
            return "answered", usage.total_tokens if usage else None
        except openai.RateLimitError as e:
            return "refused", e.response.headers.get("retry-after-ms")

    with ThreadPoolExecutor(max_workers=n) as pool:
        outcomes = list(pool.map(one, range(n)))
    print(
        json.dumps(
            {
                "answered": sum(1 for o, _ in outcomes if o == "answered"),
                "refused": sum(1 for o, _ in outcomes if o == "refused"),
                "tokens": sum(t for o, t in outcomes if o == "answered"),
                "refusals_with_a_wait": sum(
                    1 for o, w in outcomes if o == "refused" and w is not None and int(w) > 0
                ),
            }
        )
    )


def example(url):
    import openai

    oa = openai.OpenAI(
        base_url=url + "/v1",
        api_key="sk-unused",
        default_headers={"X-API-Key": "demo-free-key"},
        max_retries=0,
    )
    stream = oa.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=200,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    answer = oa.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=100
    )
    print(json.dumps({"stream": text, "json": answer.usage.total_tokens}))


def per_model(url):
    import openai

    oa, _ = clients(url, 0)
    seen = {}
    for model in ["gpt-4o", "gpt-4o-mini"] * 3:
        try:
            oa.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=10
            )
            outcome = "answered"
        except openai.RateLimitError:
            outcome = "refused"
        seen.setdefault(model, []).append(outcome)
    print(json.dumps(seen))


def unasked(url, direct):
    import urllib.request

    def chunks(base):
        oa, _ = clients(base, 0)
        stream = oa.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        return [c.model_dump() for c in stream]

    def raw(base):
        body = json.dumps(
            {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        ).encode()
        request = urllib.request.Request(
            base + "/v1/chat/completions",
            data=body,
            headers={"content-type": "application/json", "authorization": "Bearer sk-test"},
        )
        with urllib.request.urlopen(request) as answer:
            return answer.read().decode()

    print(
        json.dumps(
            {
                "through": [chunks(url), chunks(url)],
                "direct": chunks(direct),
                "raw_through": raw(url),
                "raw_direct": raw(direct),
            }
        )
    )


if __name__ == "__main__":
    mode, arg = sys.argv[1], sys.argv[2]
    if mode == "upstream":
        # 60 calls at once: more than the default backlog of 5.
        ThreadingHTTPServer.request_queue_size = 256
        ThreadingHTTPServer(("127.0.0.1", int(arg)), Upstream).serve_forever()
    elif mode == "refused":
        refused(arg)
    elif mode == "retried":
        retried(arg)
    elif mode == "billed":
        billed(arg)
    elif mode == "flood":
        flood(arg)
    elif mode == "streams":
        streams(arg, int(sys.argv[3]))
    elif mode == "example":
        example(arg)
    elif mode == "per_model":
        per_model(arg)
    elif mode == "unasked":
        unasked(arg, sys.argv[3])
    else:
        sys.exit(f"unknown mode {mode}")
