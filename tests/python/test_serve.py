#!/usr/bin/env python3
"""`dscpp serve` end to end, standard library only: completions and chat, streaming and not, n > 1, stop strings,
seed reproducibility, logprobs, greedy output equal to `dscpp generate`'s, then a hostile run (malformed and
out-of-range requests, disconnects mid-stream, a flood beyond --max-queue) after which /metrics shows nothing running
and no KV block in use and a normal request still works, then SIGTERM with a stream in flight: it finishes, exit 0.

usage: test_serve.py --dscpp BUILD/dscpp --fixture BUILD/tests/serve_fixture
"""
import http.client
import json
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading

from serve_harness import Served, parse_args

PROMPT = 'the ship sails over'


def sse(s, path, body):
    """The parsed chunks of a streaming request (the [DONE] sentinel checked and dropped)."""
    status, data, headers = s.request('POST', path, body)
    assert status == 200, (status, data)
    assert headers.get('Content-Type', '').startswith('text/event-stream'), headers
    events = [e for e in data.decode().split('\n\n') if e]
    assert all(e.startswith('data: ') for e in events), events
    assert events[-1] == 'data: [DONE]', events[-1]
    return [json.loads(e[6:]) for e in events[:-1]]


def completion(s, **kw):
    status, r = s.post('/v1/completions', dict(model='tiny', prompt=PROMPT, **kw))
    assert status == 200, r
    return r


def check_basics(s):
    status, data, _ = s.get('/v1/models')
    assert status == 200 and json.loads(data)['data'][0]['id'] == 'tiny', data
    r = completion(s, max_tokens=12, temperature=0)
    c = r['choices'][0]
    assert r['object'] == 'text_completion' and c['finish_reason'] in ('length', 'stop'), r
    assert r['usage']['completion_tokens'] >= 1 and r['usage']['prompt_tokens'] >= 2, r
    assert r['usage']['total_tokens'] == r['usage']['prompt_tokens'] + r['usage']['completion_tokens']
    # Greedy through the server equals `dscpp generate` (same prompt encoding: BOS + text).
    gen = subprocess.run([s.dscpp, 'generate', '--hf', s.model_dir, '--prompt', PROMPT, '--greedy', '--max-tokens',
                          '12'], check=True, capture_output=True)
    out, log = gen.stdout.decode('utf-8', 'replace'), gen.stderr.decode('utf-8', 'replace')
    assert 'forwards of up to 768 tokens' in log, log  # the CPU keeps the config's budget
    want = out[len(PROMPT):].rstrip('\n')
    if c['finish_reason'] == 'length':
        assert c['text'] == want, (c['text'], want)
    else:  # stopped at generation_config.json's <|im_end|>, which generate does not know
        assert want.startswith(c['text']), (c['text'], want)
    # Streaming gives the same text, chunk by chunk, and usage last when asked.
    chunks = sse(s, '/v1/completions', dict(prompt=PROMPT, max_tokens=12, temperature=0, stream=True,
                                            stream_options={'include_usage': True}))
    assert ''.join(ch['choices'][0]['text'] for ch in chunks if ch['choices']) == c['text'], chunks
    assert chunks[-1]['choices'] == [] and chunks[-1]['usage'] == r['usage'], chunks[-1]
    assert [ch for ch in chunks if ch['choices']][-1]['choices'][0]['finish_reason'] == c['finish_reason']
    return c['text']


def check_sampling(s):
    a = completion(s, max_tokens=10, n=3, seed=7, temperature=1.0)
    b = completion(s, max_tokens=10, n=3, seed=7, temperature=1.0)
    assert sorted(ch['index'] for ch in a['choices']) == [0, 1, 2], a
    ta = [ch['text'] for ch in sorted(a['choices'], key=lambda ch: ch['index'])]
    tb = [ch['text'] for ch in sorted(b['choices'], key=lambda ch: ch['index'])]
    assert ta == tb, (ta, tb)  # the same seed, the same samples
    assert len(set(ta)) > 1, ta  # seed, seed + 1, seed + 2 differ
    c = completion(s, max_tokens=10, n=3, seed=8, temperature=1.0)
    assert [ch['text'] for ch in sorted(c['choices'], key=lambda ch: ch['index'])] != ta
    # Logprobs: the greedy token is the most likely one.
    r = completion(s, max_tokens=6, temperature=0, logprobs=3)
    lp = r['choices'][0]['logprobs']
    assert len(lp['tokens']) == r['usage']['completion_tokens'] == len(lp['token_logprobs']), lp
    for chosen, top in zip(lp['token_logprobs'], lp['top_logprobs']):
        assert 1 <= len(top) <= 3 and chosen <= 0 and abs(chosen - max(top.values())) < 1e-4, (chosen, top)


def check_stop(s, greedy):
    # A stop string cut out of the greedy text: the output ends just before its first occurrence.
    stop = next(greedy[i:i + 2] for i in range(2, len(greedy) - 1) if greedy[i:i + 2].strip())
    at = greedy.find(stop)
    r = completion(s, max_tokens=12, temperature=0, stop=[stop, 'never appears'])
    assert r['choices'][0]['text'] == greedy[:at] and r['choices'][0]['finish_reason'] == 'stop', (r, stop)
    chunks = sse(s, '/v1/completions', dict(prompt=PROMPT, max_tokens=12, temperature=0, stream=True, stop=stop))
    assert ''.join(ch['choices'][0]['text'] for ch in chunks) == greedy[:at], chunks


def check_chat(s):
    msgs = [{'role': 'system', 'content': 'be brief'}, {'role': 'user', 'content': 'the quiet water'}]
    status, r = s.post('/v1/chat/completions', dict(model='tiny', messages=msgs, max_tokens=8, temperature=0,
                                                    logprobs=True, top_logprobs=2))
    assert status == 200 and r['object'] == 'chat.completion', r
    msg = r['choices'][0]['message']
    assert msg['role'] == 'assistant' and isinstance(msg['content'], str), r
    content = r['choices'][0]['logprobs']['content']
    assert len(content) == r['usage']['completion_tokens'] and all(len(t['top_logprobs']) == 2 for t in content)
    chunks = sse(s, '/v1/chat/completions', dict(messages=msgs, max_tokens=8, temperature=0, stream=True))
    assert chunks[0]['choices'][0]['delta']['role'] == 'assistant', chunks[0]
    text = ''.join(ch['choices'][0]['delta'].get('content', '') for ch in chunks)
    assert text == msg['content'], (text, msg)
    assert chunks[-1]['choices'][0]['finish_reason'] == r['choices'][0]['finish_reason']


BAD = [  # (body, field the error names, status)
    ('{not json', None, 400), ('[]', None, 400), ('"x"', None, 400), ('', None, 400),
    ({'prompt': 'a', 'model': 'gpt-4'}, 'model', 404), ({'prompt': 'a', 'model': 7}, 'model', 400),
    ({}, 'prompt', 400), ({'prompt': None}, 'prompt', 400), ({'prompt': {'a': 1}}, 'prompt', 400),
    ({'prompt': ['a', 'b']}, 'prompt', 400), ({'prompt': [1, 10 ** 9]}, 'prompt', 400),
    ({'prompt': 'a', 'max_tokens': -5}, 'max_tokens', 400), ({'prompt': 'a', 'max_tokens': 10 ** 12}, 'max_tokens', 400),
    ({'prompt': 'a', 'max_tokens': 'many'}, 'max_tokens', 400), ({'prompt': 'x ' * 400}, 'prompt', 400),
    ({'prompt': 'a', 'temperature': -1}, 'temperature', 400), ({'prompt': 'a', 'temperature': 1e308 * 10}, None, 400),
    ({'prompt': 'a', 'top_p': 7}, 'top_p', 400), ({'prompt': 'a', 'n': -1}, 'n', 400), ({'prompt': 'a', 'n': 10 ** 6}, 'n', 400),
    ({'prompt': 'a', 'stop': [1]}, 'stop', 400), ({'prompt': 'a', 'logprobs': 50}, 'logprobs', 400),
    ({'prompt': 'a', 'presence_penalty': 9}, 'presence_penalty', 400), ({'prompt': 'a', 'seed': [1]}, 'seed', 400),
    ({'prompt': 'a', 'stream': 1}, 'stream', 400), ({'prompt': 'a', 'echo': True}, 'echo', 400),
]


def hostile(s, rounds):
    rng = random.Random(3)
    for i in range(rounds):
        body, field, want = BAD[i % len(BAD)]
        raw = body if isinstance(body, str) else json.dumps(body)
        if i % 7 == 3:  # bytes that are not UTF-8 / truncated JSON
            raw = raw[:rng.randrange(len(raw) + 1)] + '\udcff'.encode('utf-8', 'surrogatepass').decode('latin-1')
            field, want = None, None
        status, data, _ = s.request('POST', '/v1/completions', raw=raw.encode('latin-1', 'replace') if isinstance(raw, str) else raw)
        assert 400 <= status < 500, (raw, status, data)
        err = json.loads(data)['error']
        assert err['message'] and 'type' in err and err['code'] is None, err
        if want is not None:
            assert status == want and (field is None or err['param'] == field), (raw, status, err)
    # Chat with wrong shapes, routes that do not exist, a body over the limit.
    for msgs in (None, [], [{'content': 'x'}], [{'role': 'user', 'content': 3}], 'hello'):
        status, r = s.post('/v1/chat/completions', {'messages': msgs})
        assert status == 400 and r['error']['param'] == 'messages', r
    assert s.request('GET', '/v1/nothing')[0] == 404
    assert s.request('POST', '/v1/completions', raw=b'{"prompt": "' + b'a' * (9 << 20) + b'"}')[0] in (400, 413)


def disconnect_mid_stream(s, n):
    for i in range(n):
        c = socket.create_connection(('127.0.0.1', s.port))
        body = json.dumps({'prompt': PROMPT, 'max_tokens': 100, 'stream': True, 'n': 2}).encode()
        c.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ' +
                  str(len(body)).encode() + b'\r\n\r\n' + body)
        if i % 2:
            c.recv(200)  # the headers and a first chunk, then gone
        c.close()


def flood(s, n):
    statuses = []
    lock = threading.Lock()

    def one():
        st, data, headers = s.request('POST', '/v1/completions', {'prompt': PROMPT, 'max_tokens': 100})
        with lock:
            statuses.append((st, headers.get('Retry-After'), data))
    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(st in (200, 503) for st, _, _ in statuses), [st for st, _, _ in statuses]
    refused = [(ra, d) for st, ra, d in statuses if st == 503]
    assert refused and all(ra for ra, _ in refused), statuses[:3]
    assert json.loads(refused[0][1])['error']['message'], refused[0]
    assert any(st == 200 for st, _, _ in statuses)


def settle(s):
    """Waits (on the server's own numbers, not a clock) until nothing runs or waits; returns the metrics."""
    for _ in range(3000):
        m = s.metrics()
        if m['dscpp:num_requests_running'] == 0 and m['dscpp:num_requests_waiting'] == 0 and \
                m['dscpp:kv_cache_used_blocks'] == 0:
            return m
        threading.Event().wait(0.01)
    raise AssertionError(f'requests or KV blocks left behind: {m}')


def sigterm_with_stream_in_flight(s):
    c = http.client.HTTPConnection('127.0.0.1', s.port, timeout=300)
    c.request('POST', '/v1/completions', body=json.dumps({'prompt': PROMPT, 'max_tokens': 60, 'stream': True,
                                                          'temperature': 0, 'ignore_eos': True}),
              headers={'Content-Type': 'application/json'})
    r = c.getresponse()
    first = r.read(6)
    assert first == b'data: ', first
    s.proc.send_signal(signal.SIGTERM)
    try:
        rest = r.read().decode('utf-8', 'replace')
    except http.client.HTTPException as e:
        raise AssertionError(f'the stream broke after SIGTERM ({e!r}); server log:\n{s.server_log()}') from e
    assert rest.rstrip().endswith('data: [DONE]'), rest[-200:]
    assert s.proc.wait(timeout=120) == 0, s.server_log()


def token_budget(args):
    """The SplitFuse budget (Note [Serving token budget]): a flag below the sequences a forward may hold is refused,
    naming both, before the model loads; the CPU's default is the config's."""
    with tempfile.TemporaryDirectory() as empty:  # no model: the refusal comes first
        r = subprocess.run([args.dscpp, 'serve', '--hf', empty, '--max-num-batched-tokens', '100'],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, r
    assert '--max-num-batched-tokens 100' in r.stderr and 'max_ragged_sequence_count (512' in r.stderr, r.stderr
    with tempfile.TemporaryDirectory() as empty:  # `dscpp generate` keeps the same rule (Note [Offline token budget])
        r = subprocess.run([args.dscpp, 'generate', '--hf', empty, '--max-num-batched-tokens', '100'],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, r
    assert '--max-num-batched-tokens 100' in r.stderr and 'max_ragged_sequence_count (512' in r.stderr, r.stderr


def main():
    args = parse_args()
    token_budget(args)
    with Served(args, ['--max-queue', '4']) as s:
        assert 'up to 768 tokens a forward' in s.server_log(), s.server_log()
        greedy = check_basics(s)
        check_sampling(s)
        check_stop(s, greedy)
        check_chat(s)
        hostile(s, 900)
        disconnect_mid_stream(s, 30)
        flood(s, 40)
        m = settle(s)
        assert m['dscpp:request_success_total:abort'] >= 1, m
        # The engine's step time: every token came from a step, and a step's forward is part of its wall time.
        assert m['dscpp:engine_steps_total'] >= 1 and m['dscpp:generation_tokens_total'] >= 1, m
        assert 0 < m['dscpp:engine_forward_seconds_total'] <= m['dscpp:engine_step_seconds_total'], m
        assert 0 <= m['dscpp:engine_sample_seconds_total'] <= m['dscpp:engine_step_seconds_total'], m
        # Every request that made a token has an end-to-end latency; those of two or more a time per output token.
        assert 1 <= m['dscpp:e2e_request_latency_seconds_count'] <= m['dscpp:time_to_first_token_seconds_count'], m
        assert 1 <= m['dscpp:time_per_output_token_seconds_count'] <= m['dscpp:e2e_request_latency_seconds_count'], m
        assert m['dscpp:time_per_output_token_seconds_sum'] <= m['dscpp:e2e_request_latency_seconds_sum'], m
        check_basics(s)
        sigterm_with_stream_in_flight(s)
    print('test_serve: ok')


if __name__ == '__main__':
    sys.exit(main())
