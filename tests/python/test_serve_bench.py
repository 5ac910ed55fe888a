#!/usr/bin/env python3
"""bench/serve_bench.py against a fake OpenAI server in this process (http.server in a thread, SSE with set delays):
TTFT / ITL / E2EL / TPOT against the server's own send times, exact token counts and goodput, failed and hung
requests, the CLI and its JSON; the metric arithmetic on hand-made outputs, the SSE parser on split bytes, the
ShareGPT loader, the random dataset and the seeded arrival schedule. Standard library only:
    python3 tests/python/test_serve_bench.py
"""
import asyncio
import io
import json
import math
import os
import random
import socket
import sys
import tempfile
import threading
import time
import unittest
from contextlib import redirect_stderr, redirect_stdout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import serve_bench as sb  # noqa: E402


class ScratchMixin:
    def scratch(self):  # a temporary folder removed after the test
        d = tempfile.TemporaryDirectory()
        self.addCleanup(d.cleanup)
        return d.name

FIRST_DELAY = 0.060  # server: request received -> first token
TOKEN_DELAY = 0.010  # server: between tokens


class FakeServer:
    """Streams max_tokens tokens "t0 t1 ...", `tokens_per_chunk` to a chunk, then a usage chunk (unless `usage` is
    off) and [DONE]. Records, per prompt, when the request arrived and when each chunk's write began (perf_counter,
    the client's clock). Prompt "bad" or max_tokens > 100 -> 400; prompt "hang" -> no answer until close()."""

    def __init__(self, chunked=True, usage=True, tokens_per_chunk=1):
        self.chunked, self.usage, self.tokens_per_chunk = chunked, usage, tokens_per_chunk
        self.records, self.bodies = {}, []
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def send_json(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/v1/models":
                    self.send_json(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
                else:
                    self.send_json(404, {"error": {"message": "no such path"}})

            def do_POST(self):
                t_recv = time.perf_counter()
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append(body)
                chat = self.path.endswith("chat/completions")
                prompt = body["messages"][0]["content"] if chat else body["prompt"]
                if prompt == "bad" or body["max_tokens"] > 100:
                    return self.send_json(400, {"error": {"message": "max_tokens: must be positive",
                                                          "param": "max_tokens"}})
                if prompt == "hang":
                    outer.release.wait()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                if outer.chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                else:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                sends = []
                n = body["max_tokens"]
                time.sleep(FIRST_DELAY)
                for i in range(0, n, outer.tokens_per_chunk):
                    if i:
                        time.sleep(TOKEN_DELAY)
                    text = "".join(f"t{j} " for j in range(i, min(n, i + outer.tokens_per_chunk)))
                    choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
                    sends.append(time.perf_counter())  # before the write: the client cannot read it earlier
                    self.event({"choices": [choice]})
                if outer.usage:
                    ptok = len(prompt) if isinstance(prompt, list) else len(prompt.split())
                    self.event({"choices": [], "usage": {"prompt_tokens": ptok, "completion_tokens": n,
                                                         "total_tokens": ptok + n}})
                self.event("[DONE]")
                if outer.chunked:
                    self.wfile.write(b"0\r\n\r\n")
                outer.records[json.dumps(prompt)] = (t_recv, sends)

            def event(self, obj):
                data = f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()
                if outer.chunked:
                    data = f"{len(data):x}\r\n".encode() + data + b"\r\n"
                self.wfile.write(data)
                self.wfile.flush()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def args_for(**kw):
    a = sb.build_parser().parse_args([])
    a.skip_test_request = True
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def run(server, requests, **kw):
    a = args_for(**kw)
    return asyncio.run(sb.run_benchmark(a, "127.0.0.1", server.port, "fake-model", requests, {}))


def median(xs):
    return sb.percentile(xs, 50)


class StreamTimingTest(unittest.TestCase):
    def check_against_server(self, server, requests, outputs, tokens_per_chunk=1):
        """Both sides read one clock (perf_counter), so each chunk's client time minus the moment the server began
        writing it is that chunk's delivery delay: >= 0, and small (a chunk taken one late would be ~10 ms off)."""
        delivery = []
        for req, out in zip(requests, outputs):
            self.assertTrue(out.success, out.error)
            t_recv, sends = server.records[json.dumps(req.prompt)]
            self.assertEqual(len(sends), math.ceil(req.output_len / tokens_per_chunk))
            self.assertEqual(len(out.itl), len(sends) - 1)  # one gap per chunk after the first; usage/[DONE] add none
            self.assertLessEqual(out.start_time, t_recv)  # the clock starts before sending
            self.assertGreaterEqual(out.ttft, FIRST_DELAY)
            t = out.start_time + out.ttft
            for gap, sent in zip([0.0] + out.itl, sends):
                t += gap
                self.assertGreaterEqual(t, sent)
                delivery.append(t - sent)
            self.assertAlmostEqual(out.latency, out.ttft + sum(out.itl), delta=1e-9)  # E2EL ends at the last token
        self.assertLess(median(delivery), 0.004, delivery)

    def test_completions_chunked_with_usage(self):
        server = FakeServer()
        try:
            reqs = [sb.Request(f"prompt number {i}", 3, 6 + i) for i in range(4)]
            outputs, duration = run(server, reqs, max_concurrency=2)
        finally:
            server.close()
        self.check_against_server(server, reqs, outputs)
        r = sb.calculate_metrics(outputs, duration, [50, 99], {})
        self.assertEqual(r["completed"], 4)
        self.assertEqual(r["failed"], 0)
        self.assertEqual(r["total_output_tokens"], 6 + 7 + 8 + 9)
        self.assertEqual(r["total_input_tokens"], 4 * 3)  # prompt_tokens of the usage chunk
        all_itl = [x for o in outputs for x in o.itl]
        self.assertEqual(len(all_itl), 5 + 6 + 7 + 8)
        self.assertGreaterEqual(r["median_itl_ms"], TOKEN_DELAY * 1e3)  # sleep() waits at least that long
        self.assertAlmostEqual(r["median_itl_ms"], median(all_itl) * 1e3, places=9)
        self.assertAlmostEqual(r["p50_itl_ms"], r["median_itl_ms"], places=9)
        for o in outputs:  # TPOT is the request's mean gap when every chunk is one token
            n = o.output_tokens
            self.assertAlmostEqual((o.latency - o.ttft) / (n - 1), sum(o.itl) / len(o.itl), places=12)
        tpots = [(o.latency - o.ttft) / (o.output_tokens - 1) for o in outputs]
        self.assertAlmostEqual(r["mean_tpot_ms"], sum(tpots) / 4 * 1e3, places=9)
        self.assertAlmostEqual(r["output_throughput"], 30 / duration, places=9)
        self.assertAlmostEqual(r["total_token_throughput"], 42 / duration, places=9)
        self.assertAlmostEqual(r["request_throughput"], 4 / duration, places=9)
        self.assertEqual(r["max_concurrent_requests"], 2)  # the cap held
        body = server.bodies[0]
        self.assertEqual(body["stream_options"], {"include_usage": True})
        self.assertIs(body["ignore_eos"], True)
        self.assertIs(body["stream"], True)
        self.assertEqual(sorted(b["max_tokens"] for b in server.bodies), [6, 7, 8, 9])

    def test_chat_close_delimited_bundled_chunks_without_usage(self):
        server = FakeServer(chunked=False, usage=False, tokens_per_chunk=2)
        try:
            reqs = [sb.Request(f"chat {i}", 2, 8) for i in range(2)]
            outputs, duration = run(server, reqs, endpoint="/v1/chat/completions")
        finally:
            server.close()
        self.check_against_server(server, reqs, outputs, tokens_per_chunk=2)
        for o in outputs:
            self.assertEqual(o.output_tokens, 0)
            self.assertEqual(o.text_chunks, 4)
            self.assertEqual(o.generated_text, "t0 t1 t2 t3 t4 t5 t6 t7 ")
        r = sb.calculate_metrics(outputs, duration, [99], {})
        self.assertEqual(r["total_output_tokens"], 8)  # no usage chunk: chunks counted, 4 per request
        self.assertEqual(r["total_input_tokens"], 4)  # no usage chunk: the dataset's count
        self.assertEqual(sorted(json.dumps(b["messages"]) for b in server.bodies),
                         [json.dumps([{"role": "user", "content": f"chat {i}"}]) for i in range(2)])
        self.assertNotIn("prompt", server.bodies[0])

    def test_usage_counts_tokens_when_chunks_bundle_them(self):
        server = FakeServer(tokens_per_chunk=3)
        try:
            outputs, duration = run(server, [sb.Request([11, 12, 13, 14, 15], 5, 9)])
        finally:
            server.close()
        self.assertEqual(outputs[0].output_tokens, 9)
        self.assertEqual(len(outputs[0].itl), 2)
        self.assertEqual(server.bodies[0]["prompt"], [11, 12, 13, 14, 15])  # ids sent as the prompt array
        r = sb.calculate_metrics(outputs, duration, [99], {})
        self.assertEqual(r["total_output_tokens"], 9)
        self.assertAlmostEqual(r["mean_tpot_ms"], (outputs[0].latency - outputs[0].ttft) / 8 * 1e3, places=9)

    def test_failures_are_counted_with_their_errors(self):
        server = FakeServer()
        try:
            reqs = [sb.Request("fine", 1, 3), sb.Request("bad", 1, 3), sb.Request("hang", 1, 3)]
            outputs, duration = run(server, reqs, request_timeout=0.5)
        finally:
            server.close()
        self.assertTrue(outputs[0].success)
        self.assertFalse(outputs[1].success)
        self.assertIn("HTTP 400", outputs[1].error)
        self.assertIn("max_tokens: must be positive", outputs[1].error)
        self.assertFalse(outputs[2].success)
        self.assertIn("--request-timeout 0.5", outputs[2].error)
        r = sb.calculate_metrics(outputs, duration, [99], {})
        self.assertEqual((r["completed"], r["failed"]), (1, 2))
        self.assertEqual(r["output_lens"], [3, 0, 0])


class CliTest(ScratchMixin, unittest.TestCase):
    def test_main_writes_table_and_vllm_keys(self):
        server = FakeServer()
        out_path = os.path.join(self.scratch(), "r.json")
        try:
            stdout = io.StringIO()
            with redirect_stdout(stdout):
                rc = sb.main(["--port", str(server.port), "--num-prompts", "3", "--random-input-len", "5",
                              "--random-output-len", "4", "--percentiles", "50,99", "--goodput", "ttft:60000",
                              "tpot:60000", "--save-result", out_path, "--request-rate", "200"])
        finally:
            server.close()
        self.assertEqual(rc, 0)
        text = stdout.getvalue()
        for line in ("Successful requests:", "Request goodput (req/s):", "Mean TTFT (ms):", "P99 ITL (ms):",
                     "Median TPOT (ms):", "P50 E2EL (ms):", "Total Token throughput (tok/s):"):
            self.assertIn(line, text)
        with open(out_path) as f:
            r = json.load(f)
        for k in ("request_throughput", "output_throughput", "total_token_throughput", "request_goodput",
                  "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "std_ttft_ms", "mean_tpot_ms", "p99_tpot_ms",
                  "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms", "p99_e2el_ms", "p50_itl_ms",
                  "completed", "failed", "total_input_tokens", "total_output_tokens", "duration",
                  "max_output_tokens_per_s", "max_concurrent_requests"):
            self.assertIn(k, r)
        self.assertEqual(r["model_id"], "fake-model")  # from GET /v1/models
        self.assertEqual(r["completed"], 3)
        self.assertEqual(r["total_output_tokens"], 12)
        self.assertEqual(r["total_input_tokens"], 15)  # five one-token words each
        self.assertAlmostEqual(r["request_goodput"], r["request_throughput"], places=9)  # SLOs nobody misses
        self.assertEqual(r["p50_itl_ms"], r["median_itl_ms"])
        self.assertEqual(len(server.bodies), 4)  # the test request, then the run
        self.assertEqual({b["model"] for b in server.bodies}, {"fake-model"})

    def test_unreachable_server_is_an_error_not_a_hang(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        err = io.StringIO()
        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            rc = sb.main(["--port", str(port), "--num-prompts", "2"])
        self.assertEqual(rc, 1)
        self.assertIn(f"127.0.0.1:{port}", err.getvalue())
        self.assertIn("ConnectionRefused", err.getvalue())

    def test_failed_test_request_stops_the_run(self):
        server = FakeServer()
        try:
            err = io.StringIO()
            with redirect_stderr(err), redirect_stdout(io.StringIO()):
                rc = sb.main(["--port", str(server.port), "--num-prompts", "5", "--random-output-len", "500"])
        finally:
            server.close()
        self.assertEqual(rc, 1)
        self.assertIn("initial test request", err.getvalue())
        self.assertIn("HTTP 400", err.getvalue())
        self.assertEqual(len(server.bodies), 1)  # the run did not start

    def test_lengths_clamped_to_one_token(self):
        server = FakeServer()
        try:
            err = io.StringIO()
            with redirect_stderr(err), redirect_stdout(io.StringIO()):
                rc = sb.main(["--port", str(server.port), "--model", "m", "--num-prompts", "2",
                              "--random-output-len", "0", "--random-input-len", "2"])
        finally:
            server.close()
        self.assertEqual(rc, 0)  # max_tokens >= 1 always: lengths are clamped to 1, not refused by the server
        self.assertEqual([b["max_tokens"] for b in server.bodies], [1, 1, 1])

    def test_bad_flags_name_the_flag(self):
        for argv, flag in ((["--goodput", "ttft=5"], "--goodput"), (["--goodput", "speed:5"], "--goodput"),
                           (["--random-range-ratio", "1.5"], "--random-range-ratio"),
                           (["--dataset", "sharegpt"], "--dataset-path"),
                           (["--random-prompt", "ids", "--endpoint", "/v1/chat/completions"], "--random-prompt"),
                           (["--burstiness", "0"], "--burstiness"), (["--percentiles", "120"], "--percentiles")):
            err = io.StringIO()
            with redirect_stderr(err), redirect_stdout(io.StringIO()):
                rc = sb.main(argv + ["--port", "1", "--model", "m"])
            self.assertEqual(rc, 1, argv)
            self.assertIn(flag, err.getvalue(), argv)


def out(ttft, latency, n, itl=()):
    return sb.Output(success=True, prompt_len=10, output_tokens=n, ttft=ttft, latency=latency, itl=list(itl))


class MetricsTest(unittest.TestCase):
    def test_percentile_matches_numpy_linear(self):
        xs = [4.0, 1.0, 3.0, 2.0]
        self.assertEqual(sb.percentile(xs, 0), 1.0)
        self.assertEqual(sb.percentile(xs, 100), 4.0)
        self.assertAlmostEqual(sb.percentile(xs, 50), 2.5)
        self.assertAlmostEqual(sb.percentile(xs, 99), 3.97)  # numpy.percentile([1,2,3,4], 99)
        self.assertAlmostEqual(sb.percentile([5.0], 99), 5.0)
        mean, med, std, p = sb.stats([0.001, 0.002, 0.003, 0.004], [90])
        self.assertAlmostEqual(mean, 2.5)
        self.assertAlmostEqual(std, math.sqrt(1.25))  # population std, as numpy.std
        self.assertAlmostEqual(p[0][1], 3.7)
        self.assertEqual(sb.stats([], [99]), (0.0, 0.0, 0.0, [(99, 0.0)]))

    def test_goodput_tpot_and_exclusions(self):
        outs = [out(0.100, 1.000, 10, [0.1] * 9),   # tpot 100 ms
                out(0.300, 0.700, 5, [0.1] * 4),    # tpot 100 ms, ttft 300
                out(0.050, 0.050, 1),               # one token: no TPOT sample, TPOT 0 for goodput
                out(0.020, 2.020, 11, [0.2] * 10),  # tpot 200 ms
                sb.Output(success=False, error="HTTP 503")]
        r = sb.calculate_metrics(outs, 2.0, [99], {"ttft": 250, "tpot": 150})
        self.assertEqual(r["completed"], 4)
        self.assertEqual(r["failed"], 1)
        self.assertAlmostEqual(r["request_goodput"], 2 / 2.0)  # the first and the one-token request
        self.assertAlmostEqual(r["mean_tpot_ms"], (100 + 100 + 200) / 3)
        self.assertAlmostEqual(r["median_ttft_ms"], 75.0)
        self.assertAlmostEqual(r["mean_e2el_ms"], (1000 + 700 + 50 + 2020) / 4)
        self.assertEqual(r["total_output_tokens"], 27)
        self.assertEqual(r["total_input_tokens"], 40)
        self.assertAlmostEqual(r["output_throughput"], 13.5)
        self.assertAlmostEqual(r["total_token_throughput"], 33.5)
        self.assertEqual(len([x for o in outs for x in o.itl]), 23)
        self.assertAlmostEqual(r["mean_itl_ms"], (0.1 * 13 + 0.2 * 10) / 23 * 1e3)
        r = sb.calculate_metrics(outs, 2.0, [99], {"e2el": 1000})
        self.assertAlmostEqual(r["request_goodput"], 3 / 2.0)  # 1000 ms meets an SLO of 1000 ms
        self.assertIsNone(sb.calculate_metrics(outs, 2.0, [99], {})["request_goodput"])

    def test_peaks(self):
        a = out(0.5, 1.0, 3, [0.25, 0.25])
        a.start_time = 10.0
        b = out(0.1, 2.5, 2, [2.4])
        b.start_time = 10.8
        tok, conc = sb.peaks([a, b])
        self.assertEqual(conc, 2)
        self.assertEqual(tok, 3.0)  # second 0: a's tokens at 0.5 and 0.75, b's at 0.9 (a's third is at 1.0)

    def test_sse_parser_on_split_bytes(self):
        stream = ('data: {"choices":[{"text":"é"}]}\r\n\r\n: ping\n\ndata: {"a":\ndata: 1}\n\n'
                  'event: x\ndata: [DONE]\n\n').encode()
        p = sb.SseParser()
        events = []
        for i in range(len(stream)):  # one byte at a time: splits UTF-8 and every line
            events += p.feed(stream[i:i + 1])
        self.assertEqual(events, ['{"choices":[{"text":"é"}]}', '{"a":\n1}', "[DONE]"])
        self.assertEqual(json.loads(events[0])["choices"][0]["text"], "é")


class WorkloadTest(ScratchMixin, unittest.TestCase):
    def test_sharegpt_loader(self):
        conv = lambda *turns: {"id": "x", "conversations": [{"from": f, "value": v} for f, v in turns]}  # noqa
        data = [conv(("human", "a" * 40), ("gpt", "b" * 80)),
                conv(("human", "only a question here, nothing else")),
                conv(("human", "hi"), ("gpt", "c" * 100)),
                conv(("system", "be brief"), ("human", "d" * 60), ("gpt", "e" * 20)),
                conv(("human", "f" * 5000), ("gpt", "g" * 40)),
                conv(("human", "h" * 3000), ("gpt", "i" * 6000)),
                {"no": "conversations"}]
        path = os.path.join(self.scratch(), "sharegpt.json")
        with open(path, "w") as f:
            json.dump(data, f)
        reqs = sb.load_sharegpt(path, 2, random.Random(0))
        self.assertEqual(sorted((r.prompt[0], r.prompt_len, r.output_len) for r in reqs),
                         [("a", 10, 20), ("d", 15, 5)])
        fixed = sb.load_sharegpt(path, 2, random.Random(1), fixed_output_len=7)
        self.assertEqual(sorted(r.output_len for r in fixed), [7, 7])
        with self.assertRaisesRegex(ValueError, "only 2 usable conversations, --num-prompts is 3"):
            sb.load_sharegpt(path, 3, random.Random(0))

    def test_random_dataset(self):
        reqs = sb.sample_random(random.Random(3), 50, 100, 20, 0.0, "words", 32000)
        self.assertEqual({(r.prompt_len, r.output_len) for r in reqs}, {(100, 20)})
        self.assertEqual({len(r.prompt.split()) for r in reqs}, {100})
        self.assertGreater(len({r.prompt for r in reqs}), 45)  # prompts differ: no shared prefix to cache
        ids = sb.sample_random(random.Random(3), 50, 100, 20, 0.5, "ids", 5000)
        self.assertTrue(all(50 <= r.prompt_len <= 150 and 10 <= r.output_len <= 30 for r in ids))
        self.assertGreater(len({r.prompt_len for r in ids}), 10)
        self.assertTrue(all(len(r.prompt) == r.prompt_len and all(1000 <= t < 5000 for t in r.prompt) for r in ids))
        again = sb.sample_random(random.Random(3), 50, 100, 20, 0.5, "ids", 5000)
        self.assertEqual([r.prompt for r in ids], [r.prompt for r in again])

    def test_poisson_arrivals(self):
        n, rate = 4000, 50.0
        t = sb.arrival_times(n, rate, 1.0, random.Random(7))
        self.assertAlmostEqual(t[-1], n / rate, places=9)  # rescaled: mean rate exact
        gaps = [b - a for a, b in zip([0.0] + t, t)]
        mean = sum(gaps) / n
        self.assertAlmostEqual(mean, 1 / rate, places=12)
        cv = math.sqrt(sum((g - mean) ** 2 for g in gaps) / n) / mean
        self.assertAlmostEqual(cv, 1.0, delta=0.08)  # exponential: std = mean (sd of this estimate ~0.02)
        below = sum(g < mean for g in gaps) / n
        self.assertAlmostEqual(below, 1 - math.exp(-1), delta=0.03)  # P(X < mean) of an exponential
        self.assertEqual(t, sb.arrival_times(n, rate, 1.0, random.Random(7)))
        self.assertNotEqual(t, sb.arrival_times(n, rate, 1.0, random.Random(8)))
        g4 = sb.arrival_times(n, rate, 4.0, random.Random(7))
        gaps4 = [b - a for a, b in zip([0.0] + g4, g4)]
        cv4 = math.sqrt(sum((g - 1 / rate) ** 2 for g in gaps4) / n) * rate
        self.assertAlmostEqual(cv4, 0.5, delta=0.05)  # gamma shape 4: cv = 1/sqrt(4)
        self.assertEqual(sb.arrival_times(3, float("inf"), 1.0, random.Random(0)), [0.0, 0.0, 0.0])
        fixed = sb.arrival_times(4, 2.0, float("inf"), random.Random(0))
        self.assertEqual([round(x, 12) for x in fixed], [0.5, 1.0, 1.5, 2.0])


if __name__ == "__main__":
    unittest.main()
