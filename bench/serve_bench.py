#!/usr/bin/env python3
"""Load generator for OpenAI-compatible servers (dscpp serve, vLLM, SGLang, ...), reporting vLLM's `vllm bench serve`
(formerly benchmarks/benchmark_serving.py) metrics with its definitions and JSON key names, so results of ours and of a
peer parse side by side. Standard library only: asyncio with HTTP/1.1 over asyncio streams, server-sent events parsed
here.

  serve_bench.py --base-url http://127.0.0.1:8000 --dataset random --random-input-len 1024 --random-output-len 128 \\
                 --num-prompts 200 --request-rate 4 --goodput ttft:200 tpot:20 --save-result out.json
  serve_bench.py --port 8000 --dataset sharegpt --dataset-path ShareGPT_V3_unfiltered_cleaned_split.json \\
                 --num-prompts 1000 --max-concurrency 64 --endpoint /v1/chat/completions

Metric definitions (as vLLM's calculate_metrics and its OpenAI request functions):
  TTFT  send -> first SSE chunk whose `choices` is non-empty (a chat role chunk counts, as in vLLM).
  ITL   every gap between consecutive such chunks, pooled over all requests (a chunk may carry several tokens).
  E2EL  send -> last such chunk (the trailing usage chunk and [DONE] do not count).
  TPOT  per request (E2EL - TTFT) / (output tokens - 1); requests of <= 1 output token are left out of TPOT stats and
        count as TPOT 0 for goodput.
  Output tokens: the usage chunk's completion_tokens (stream_options.include_usage); without one, the number of chunks
  that carried text. Input tokens: the usage chunk's prompt_tokens, else the dataset's own count.
  Throughputs divide by the benchmark's wall time; goodput = requests meeting every --goodput SLO per second.
  Statistics: mean, median, population std, percentiles with linear interpolation (numpy's defaults).
"""
import argparse
import asyncio
import codecs
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import urlsplit

# Common English words that are one token (with their leading space) in the GPT-2, Llama 3, Qwen2 and Mistral BPE
# vocabularies, so a prompt of N of them is about N tokens without a tokenizer here.
WORDS = ("the of and to in is was for that on as with by he it at from his an were are which be this has or had "
         "not but first one their its new after who they have her she two been other when there all during into "
         "school time may years more most only over city some world would where later up such used many can state "
         "about national out known university united then made group").split()


@dataclass
class Request:
    prompt: object  # str, or a list of token ids (random dataset, --random-prompt ids)
    prompt_len: int
    output_len: int


@dataclass
class Output:
    success: bool = False
    error: str = ""
    prompt_len: int = 0
    output_tokens: int = 0  # from the usage chunk; 0 when the server sent none
    text_chunks: int = 0
    generated_text: str = ""
    start_time: float = 0.0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------------- datasets

def sample_random(rng, n, input_len, output_len, range_ratio, style, vocab_size):
    """vLLM's random dataset lengths: uniform integers in [floor(L(1-r)), ceil(L(1+r))]."""
    if not 0 <= range_ratio < 1:
        raise ValueError(f"--random-range-ratio {range_ratio}: must be in [0, 1)")
    def lens(length, low_min):
        lo = max(low_min, math.floor(length * (1 - range_ratio)))
        hi = max(lo, math.ceil(length * (1 + range_ratio)))
        return [rng.randint(lo, hi) for _ in range(n)]
    reqs = []
    for ilen, olen in zip(lens(input_len, 1), lens(output_len, 1)):
        if style == "ids":
            # Skip the lowest ids: byte and special tokens sit there in several vocabularies.
            prompt = [rng.randrange(1000, vocab_size) for _ in range(ilen)]
        else:
            prompt = "".join(" " + rng.choice(WORDS) for _ in range(ilen)).lstrip()
        reqs.append(Request(prompt, ilen, olen))
    return reqs


def estimate_tokens(text):
    """About four characters a token, the usual rule for English BPE vocabularies (no tokenizer here)."""
    return max(1, round(len(text) / 4))


def load_sharegpt(path, n, rng, fixed_output_len=None):
    """ShareGPT JSON: a list of {"conversations": [{"from": "human"|"gpt", "value": text}, ...]}. The first human turn
    is the prompt, the first gpt turn after it sets the output length. Pruned as vLLM prunes (prompt or output < 4
    tokens, prompt > 1024, prompt + output > 2048), lengths estimated at 4 characters a token; shuffled by --seed."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, list):
        raise ValueError(f"--dataset-path {path}: expected a JSON list of conversations, got {type(data).__name__}")
    rng.shuffle(data)
    reqs = []
    for entry in data:
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list):
            continue
        human = next((i for i, t in enumerate(turns) if t.get("from") in ("human", "user")), None)
        if human is None:
            continue
        gpt = next((t for t in turns[human + 1:] if t.get("from") in ("gpt", "chatgpt", "assistant")), None)
        if gpt is None:
            continue
        prompt = turns[human].get("value") or ""
        prompt_len = estimate_tokens(prompt)
        output_len = fixed_output_len or estimate_tokens(gpt.get("value") or "")
        if prompt_len < 4 or (fixed_output_len is None and output_len < 4):
            continue
        if prompt_len > 1024 or prompt_len + output_len > 2048:
            continue
        reqs.append(Request(prompt, prompt_len, output_len))
        if len(reqs) == n:
            break
    if len(reqs) < n:
        raise ValueError(f"--dataset-path {path}: only {len(reqs)} usable conversations, --num-prompts is {n}")
    return reqs


# ----------------------------------------------------------------------------------------------------------- arrivals

def arrival_times(n, rate, burstiness, rng):
    """Send time of each request, seconds from the start, as vLLM's get_request: gamma intervals (shape b, mean
    1/rate; b = 1 is a Poisson process), cumulated, then rescaled so the last falls at n / rate (steadies the
    throughput across seeds). rate inf: all at 0; burstiness inf: evenly spaced."""
    if not burstiness > 0:
        raise ValueError(f"--burstiness {burstiness}: must be > 0")
    if not rate > 0:
        raise ValueError(f"--request-rate {rate}: must be > 0 (inf sends all at once)")
    if math.isinf(rate):
        return [0.0] * n
    t, out = 0.0, []
    for _ in range(n):
        t += 1.0 / rate if math.isinf(burstiness) else rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
        out.append(t)
    scale = (n / rate) / out[-1]
    return [x * scale for x in out]


# --------------------------------------------------------------------------------------------------------------- HTTP

class HttpError(Exception):
    pass


async def http_request(host, port, method, path, body=None, headers=None):
    """One HTTP/1.1 exchange on a fresh connection: returns (status, reason, body chunks as an async iterator). The
    body is read by Content-Length, chunked transfer coding, or to the close of the connection."""
    reader, writer = await asyncio.open_connection(host, port)
    payload = b"" if body is None else json.dumps(body).encode()
    head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close", "Accept: */*",
            f"Content-Length: {len(payload)}"]
    if body is not None:
        head.append("Content-Type: application/json")
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    try:
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        await writer.drain()
        status_line = (await reader.readline()).decode("latin-1").strip()
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise HttpError(f"bad HTTP status line {status_line!r}" if status_line else
                            "the server closed the connection without an answer")
        status, reason = int(parts[1]), parts[2] if len(parts) > 2 else ""
        hdrs = {}
        while True:
            line = (await reader.readline()).decode("latin-1")
            if line in ("\r\n", "\n", ""):
                break
            k, _, v = line.partition(":")
            hdrs[k.strip().lower()] = v.strip()
    except BaseException:  # a timeout's cancellation included: never leave the socket open
        writer.close()
        raise

    async def chunks():
        try:
            if "chunked" in hdrs.get("transfer-encoding", "").lower():
                while True:
                    size_line = await reader.readline()
                    if not size_line:
                        raise HttpError("connection closed inside a chunked body")
                    size = int(size_line.split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        return
                    data = await reader.readexactly(size)
                    await reader.readline()
                    yield data
            elif "content-length" in hdrs:
                left = int(hdrs["content-length"])
                while left > 0:
                    data = await reader.read(min(left, 65536))
                    if not data:
                        raise HttpError("connection closed before Content-Length bytes")
                    left -= len(data)
                    yield data
            else:
                while data := await reader.read(65536):
                    yield data
        finally:
            writer.close()
    return status, reason, chunks()


async def read_all(chunks, limit=1 << 20):
    out = b""
    async for c in chunks:
        out += c
        if len(out) > limit:
            break
    return out


class SseParser:
    """Server-sent events: returns the data of each complete event (data lines joined by newlines); comments and
    other fields are dropped. Bytes may split anywhere, UTF-8 sequences included."""
    def __init__(self):
        self.buf = ""
        self.decoder = codecs.getincrementaldecoder("utf-8")()

    def feed(self, data):
        self.buf += self.decoder.decode(data).replace("\r\n", "\n").replace("\r", "\n")
        events = []
        while "\n\n" in self.buf:
            block, self.buf = self.buf.split("\n\n", 1)
            lines = [ln[5:].removeprefix(" ") for ln in block.split("\n") if ln.startswith("data:")]
            if lines:
                events.append("\n".join(lines))
        return events


def request_body(endpoint, model, req, ignore_eos, temperature):
    body = {"model": model, "max_tokens": req.output_len, "stream": True, "stream_options": {"include_usage": True}}
    if endpoint.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    if ignore_eos:
        body["ignore_eos"] = True
    if temperature is not None:
        body["temperature"] = temperature
    return body


async def send_request(host, port, endpoint, body, prompt_len, headers=None):
    """One streamed request, timed as vLLM's async_request_openai_(chat_)completions."""
    out = Output(prompt_len=prompt_len)
    chat = "messages" in body
    text = []
    st = time.perf_counter()
    out.start_time = last = st
    first = False
    chunks = None
    try:
        status, reason, chunks = await http_request(host, port, "POST", endpoint, body, headers)
        if status != 200:
            detail = (await read_all(chunks, 4096)).decode("utf-8", "replace").strip()
            out.error = f"HTTP {status} {reason}: {detail[:500]}"
            return out
        sse = SseParser()
        async for data in chunks:
            now = time.perf_counter()
            for ev in sse.feed(data):
                if ev == "[DONE]":
                    continue
                msg = json.loads(ev)
                if "error" in msg and not msg.get("choices"):
                    raise HttpError(f"error event in the stream: {json.dumps(msg['error'])[:500]}")
                if choices := msg.get("choices"):
                    piece = (choices[0].get("delta") or {}).get("content") if chat else choices[0].get("text")
                    if first:
                        out.itl.append(now - last)
                    else:
                        first, out.ttft = True, now - st
                    last = now
                    if piece:
                        text.append(piece)
                        out.text_chunks += 1
                elif usage := msg.get("usage"):
                    out.output_tokens = usage.get("completion_tokens") or 0
                    if usage.get("prompt_tokens") is not None:
                        out.prompt_len = usage["prompt_tokens"]
        out.generated_text = "".join(text)
        out.latency = last - st
        out.success = first
        if not first:
            out.error = "the stream ended without a chunk carrying choices (no first token to time)"
    except Exception as e:  # noqa: BLE001 - every failure becomes the request's error, the run goes on
        out.error = f"{type(e).__name__}: {e}"
    finally:
        if chunks is not None:
            await chunks.aclose()  # closes the connection, also when a timeout cancels the read
    return out


# ------------------------------------------------------------------------------------------------------------ metrics

def percentile(values, p):
    """numpy.percentile's default (linear interpolation between closest ranks)."""
    xs = sorted(values)
    if not xs:
        return 0.0
    k = (len(xs) - 1) * p / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def stats(values, percentiles):
    """(mean, median, std, [(p, value)]) in ms; zeros for an empty list, as vLLM's `np.mean(xs or 0)`."""
    xs = list(values) or [0.0]
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
    return mean * 1e3, percentile(xs, 50) * 1e3, std * 1e3, [(p, percentile(xs, p) * 1e3) for p in percentiles]


def calculate_metrics(outputs, duration, percentiles, goodput_slo):
    """vLLM's calculate_metrics (outputs from send_request, duration in s, goodput SLOs in ms) -> result dict."""
    output_lens, ttfts, tpots, all_tpots, itls, e2els = [], [], [], [], [], []
    total_input = good = 0
    for o in outputs:
        if not o.success:
            output_lens.append(0)
            continue
        n = o.output_tokens or o.text_chunks
        output_lens.append(n)
        total_input += o.prompt_len
        tpot = 0.0
        if n > 1:
            tpot = (o.latency - o.ttft) / (n - 1)
            tpots.append(tpot)
        all_tpots.append(tpot)
        itls += o.itl
        ttfts.append(o.ttft)
        e2els.append(o.latency)
        if goodput_slo and all(v <= goodput_slo[k] / 1e3 for k, v in
                               (("ttft", o.ttft), ("tpot", tpot), ("e2el", o.latency)) if k in goodput_slo):
            good += 1
    completed = len(ttfts)
    total_output = sum(output_lens)
    r = {"duration": duration, "completed": completed, "failed": len(outputs) - completed,
         "total_input_tokens": total_input, "total_output_tokens": total_output,
         "request_throughput": completed / duration,
         "request_goodput": good / duration if goodput_slo else None,
         "output_throughput": total_output / duration,
         "total_token_throughput": (total_input + total_output) / duration}
    r["max_output_tokens_per_s"], r["max_concurrent_requests"] = peaks([o for o in outputs if o.success])
    for name, xs in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        mean, median, std, pcts = stats(xs, percentiles)
        r[f"mean_{name}_ms"], r[f"median_{name}_ms"], r[f"std_{name}_ms"] = mean, median, std
        for p, v in pcts:
            r[f"p{int(p) if int(p) == p else p}_{name}_ms"] = v
    r.update({"input_lens": [o.prompt_len for o in outputs], "output_lens": output_lens,
              "ttfts": [o.ttft for o in outputs], "itls": [o.itl for o in outputs],
              "latencies": [o.latency for o in outputs], "start_times": [o.start_time for o in outputs],
              "generated_texts": [o.generated_text for o in outputs], "errors": [o.error for o in outputs]})
    return r


def peaks(ok):
    """vLLM's peak output tokens per 1-s bucket (token times = start + TTFT + cumulative ITLs; one per chunk) and
    peak concurrent requests (sweep over [start, start + E2EL))."""
    if not ok:
        return 0.0, 0
    t0 = min(o.start_time for o in ok)
    buckets = {}
    for o in ok:
        t = o.start_time + o.ttft
        for gap in [0.0] + o.itl:
            t += gap
            buckets[int(t - t0)] = buckets.get(int(t - t0), 0) + 1
    events = sorted([(o.start_time, 1) for o in ok] + [(o.start_time + o.latency, -1) for o in ok])
    cur = peak = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return float(max(buckets.values())), peak


def print_table(r, args, goodput_slo, metrics_shown, percentiles):
    line = "{:<40} {:<10}".format
    linef = "{:<40} {:<10.2f}".format
    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    print(line("Successful requests:", r["completed"]))
    print(line("Failed requests:", r["failed"]))
    if args.max_concurrency is not None:
        print(line("Maximum request concurrency:", args.max_concurrency))
    if not math.isinf(args.request_rate):
        print(linef("Request rate configured (RPS):", args.request_rate))
    print(linef("Benchmark duration (s):", r["duration"]))
    print(line("Total input tokens:", r["total_input_tokens"]))
    print(line("Total generated tokens:", r["total_output_tokens"]))
    print(linef("Request throughput (req/s):", r["request_throughput"]))
    if goodput_slo:
        print(linef("Request goodput (req/s):", r["request_goodput"]))
    print(linef("Output token throughput (tok/s):", r["output_throughput"]))
    print(linef("Peak output token throughput (tok/s):", r["max_output_tokens_per_s"]))
    print(linef("Peak concurrent requests:", r["max_concurrent_requests"]))
    print(linef("Total Token throughput (tok/s):", r["total_token_throughput"]))
    headers = {"ttft": ("TTFT", "Time to First Token"), "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
               "itl": ("ITL", "Inter-token Latency"), "e2el": ("E2EL", "End-to-end Latency")}
    for key in metrics_shown:
        short, title = headers[key]
        print("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        print(linef(f"Mean {short} (ms):", r[f"mean_{key}_ms"]))
        print(linef(f"Median {short} (ms):", r[f"median_{key}_ms"]))
        for p in percentiles:
            w = int(p) if int(p) == p else p
            print(linef(f"P{w} {short} (ms):", r[f"p{w}_{key}_ms"]))
    print("=" * 50)


# --------------------------------------------------------------------------------------------------------------- main

async def first_model(host, port, timeout):
    status, reason, chunks = await asyncio.wait_for(http_request(host, port, "GET", "/v1/models"), timeout)
    body = await asyncio.wait_for(read_all(chunks), timeout)
    if status != 200:
        raise HttpError(f"GET /v1/models answered HTTP {status} {reason}: {body[:300]!r}")
    models = json.loads(body).get("data") or []
    if not models:
        raise HttpError("GET /v1/models lists no model; pass --model")
    return models[0]["id"]


async def run_benchmark(args, host, port, model, requests, goodput_slo):
    async def timed(req):
        body = request_body(args.endpoint, model, req, args.ignore_eos, args.temperature)
        try:
            return await asyncio.wait_for(send_request(host, port, args.endpoint, body, req.prompt_len),
                                          args.request_timeout)
        except asyncio.TimeoutError:
            return Output(prompt_len=req.prompt_len, error=f"no complete answer within --request-timeout "
                                                           f"{args.request_timeout} s")

    if not args.skip_test_request:
        print("Starting initial single prompt test run...")
        test = await timed(requests[0])
        if not test.success:
            raise HttpError(f"the initial test request to {args.endpoint} failed: {test.error}")
        print("Initial test run completed. Starting main benchmark run...")
    print(f"Traffic request rate: {args.request_rate}")
    dist = "Poisson process" if args.burstiness == 1.0 else "Gamma distribution"
    print(f"Burstiness factor: {args.burstiness} ({dist})")
    print(f"Maximum request concurrency: {args.max_concurrency}")

    times = arrival_times(len(requests), args.request_rate, args.burstiness, random.Random(args.seed))
    sem = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None

    async def limited(req):
        if sem is None:
            return await timed(req)
        async with sem:
            return await timed(req)

    start = time.perf_counter()
    tasks = []
    for req, t in zip(requests, times):
        delay = start + t - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(limited(req)))
    outputs = await asyncio.gather(*tasks)
    return outputs, time.perf_counter() - start


def parse_goodput(pairs):
    slo = {}
    for pair in pairs or []:
        name, sep, value = pair.partition(":")
        try:
            ms = float(value)
        except ValueError:
            ms = None
        if not sep or name not in ("ttft", "tpot", "e2el") or ms is None or ms < 0:
            raise ValueError(f"--goodput {pair!r}: expected NAME:MS with NAME one of ttft, tpot, e2el and MS >= 0")
        slo[name] = ms
    return slo


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("server")
    g.add_argument("--base-url", help="server URL, e.g. http://127.0.0.1:8000 (else --host and --port)")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--endpoint", default="/v1/completions",
                   help="/v1/completions (default) or /v1/chat/completions (prompt sent as one user message)")
    g.add_argument("--model", help="model name sent in each request (default: the first of GET /v1/models)")
    g.add_argument("--request-timeout", type=float, default=600.0,
                   help="seconds one request may take, connect to last byte, before it counts as failed (600)")
    g.add_argument("--skip-test-request", action="store_true",
                   help="do not send the first prompt once before the run (vLLM's readiness check)")
    g = p.add_argument_group("workload")
    g.add_argument("--dataset", "--dataset-name", dest="dataset", choices=("random", "sharegpt"), default="random")
    g.add_argument("--dataset-path", help="ShareGPT JSON file (--dataset sharegpt)")
    g.add_argument("--num-prompts", type=int, default=1000, help="requests in the run (1000)")
    g.add_argument("--seed", type=int, default=0, help="seeds the prompts, their lengths and the arrival times (0)")
    g.add_argument("--random-input-len", type=int, default=1024, help="prompt tokens of --dataset random (1024)")
    g.add_argument("--random-output-len", type=int, default=128, help="max_tokens of --dataset random (128)")
    g.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="lengths uniform in [L(1-r), L(1+r)], r in [0, 1) as vLLM (0: fixed lengths)")
    g.add_argument("--random-prompt", choices=("words", "ids"), default="words",
                   help="words (default): N random common English words, one BPE token each in the Llama 3 / "
                        "GPT-2 / Qwen2 / Mistral vocabularies, so about N tokens (the server's usage count is "
                        "reported); ids: N random token ids sent as the prompt array (/v1/completions only), "
                        "exactly N tokens")
    g.add_argument("--random-vocab-size", type=int, default=32000,
                   help="token ids of --random-prompt ids are drawn from [1000, this) (32000)")
    g.add_argument("--sharegpt-output-len", type=int,
                   help="max_tokens of every ShareGPT request (default: the first gpt turn's length in tokens, "
                        "estimated at 4 characters a token)")
    g.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="send ignore_eos so every request generates max_tokens (default on)")
    g.add_argument("--temperature", type=float, help="sent when given (vLLM's benchmark sends none)")
    g = p.add_argument_group("arrivals")
    g.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests per second, Poisson arrivals (inf, the default: all at once)")
    g.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of the intervals: 1 Poisson, < 1 burstier, > 1 steadier, inf fixed rate")
    g.add_argument("--max-concurrency", type=int, help="at most this many requests in flight")
    g = p.add_argument_group("results")
    g.add_argument("--percentile-metrics", default="ttft,tpot,itl,e2el",
                   help="metrics whose statistics are printed (ttft,tpot,itl,e2el)")
    g.add_argument("--percentiles", "--metric-percentiles", dest="percentiles", default="99",
                   help="comma-separated percentiles reported beside mean and median (99)")
    g.add_argument("--goodput", nargs="+", metavar="NAME:MS",
                   help="SLOs, e.g. ttft:200 tpot:20 e2el:5000; goodput = requests meeting all of them per second")
    g.add_argument("--save-result", metavar="FILE", help="write the result JSON (vLLM's key names) here")
    g.add_argument("--save-detailed", action="store_true",
                   help="keep per-request lists (input_lens, output_lens, ttfts, itls, latencies, start_times, "
                        "generated_texts, errors) in the JSON")
    g.add_argument("--label", default="dscpp-serve-bench", help="the JSON's backend field")
    return p


def raise_open_file_limit():
    """One connection per request: rate inf with 1,000 prompts needs more sockets than the usual soft limit."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))
    except (ImportError, ValueError, OSError):
        pass


def main(argv=None):
    args = build_parser().parse_args(argv)
    raise_open_file_limit()
    try:
        if args.base_url:
            u = urlsplit(args.base_url)
            if u.scheme != "http" or not u.hostname:
                raise ValueError(f"--base-url {args.base_url}: expected http://HOST[:PORT] (no TLS here)")
            host, port = u.hostname, u.port or 80
        else:
            host, port = args.host, args.port
        if args.num_prompts < 1:
            raise ValueError(f"--num-prompts {args.num_prompts}: must be >= 1")
        if args.max_concurrency is not None and args.max_concurrency < 1:
            raise ValueError(f"--max-concurrency {args.max_concurrency}: must be >= 1")
        percentiles = [float(x) for x in args.percentiles.split(",")]
        if any(not 0 <= x <= 100 for x in percentiles):
            raise ValueError(f"--percentiles {args.percentiles}: each must be in [0, 100]")
        shown = [m for m in args.percentile_metrics.split(",") if m]
        if any(m not in ("ttft", "tpot", "itl", "e2el") for m in shown):
            raise ValueError(f"--percentile-metrics {args.percentile_metrics}: names are ttft, tpot, itl, e2el")
        goodput_slo = parse_goodput(args.goodput)
        arrival_times(1, args.request_rate, args.burstiness, random.Random(0))  # checks both before any request
        rng = random.Random(args.seed)
        if args.dataset == "random":
            if args.random_prompt == "ids" and args.endpoint.endswith("chat/completions"):
                raise ValueError("--random-prompt ids needs /v1/completions: a chat message is text")
            requests = sample_random(rng, args.num_prompts, args.random_input_len, args.random_output_len,
                                     args.random_range_ratio, args.random_prompt, args.random_vocab_size)
        else:
            if not args.dataset_path:
                raise ValueError("--dataset sharegpt needs --dataset-path FILE")
            requests = load_sharegpt(args.dataset_path, args.num_prompts, rng, args.sharegpt_output_len)
        model = args.model or asyncio.run(first_model(host, port, args.request_timeout))
        print(f"Model: {model}  server: http://{host}:{port}{args.endpoint}")
        outputs, duration = asyncio.run(run_benchmark(args, host, port, model, requests, goodput_slo))
    except (OSError, ValueError, HttpError, asyncio.TimeoutError) as e:
        where = args.base_url or f"http://{args.host}:{args.port}"
        print(f"serve_bench: error: {type(e).__name__}: {e or 'timed out'} (server {where})", file=sys.stderr)
        return 1
    r = calculate_metrics(outputs, duration, percentiles, goodput_slo)
    failed = [o.error for o in outputs if not o.success]
    if failed:
        print(f"Failed requests: {len(failed)} (first 10 errors below)")
        for i, err in enumerate(failed[:10]):
            print(f"Error {i}: {err}")
    print_table(r, args, goodput_slo, shown, percentiles)
    if args.save_result:
        result = {"date": datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": args.label, "model_id": model,
                  "endpoint": args.endpoint, "dataset": args.dataset, "num_prompts": args.num_prompts,
                  "request_rate": args.request_rate if not math.isinf(args.request_rate) else "inf",
                  "burstiness": args.burstiness, "max_concurrency": args.max_concurrency, **r}
        if not args.save_detailed:
            for k in ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "generated_texts"):
                del result[k]
            result["errors"] = failed
        with open(args.save_result, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0 if r["completed"] else 1


if __name__ == "__main__":
    sys.exit(main())
