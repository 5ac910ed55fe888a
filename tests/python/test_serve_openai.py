#!/usr/bin/env python3
"""`dscpp serve` through the real `openai` client (PyPI): completions and chat, streaming and not, n > 1, stop
strings, seed reproducibility, logprobs. Exit 77 (skipped) where the package is not installed.

usage: test_serve_openai.py --dscpp BUILD/dscpp --fixture BUILD/tests/serve_fixture
"""
import sys

from serve_harness import Served, parse_args

try:
    import openai
except ImportError:
    print('test_serve_openai: skipped (pip install openai)')
    sys.exit(77)

PROMPT = 'the ship sails over'


def main():
    args = parse_args()
    with Served(args) as s:
        client = openai.OpenAI(base_url=s.url + '/v1', api_key='unused', max_retries=0)
        assert [m.id for m in client.models.list().data] == ['tiny']
        r = client.completions.create(model='tiny', prompt=PROMPT, max_tokens=12, temperature=0)
        greedy = r.choices[0].text
        assert r.usage.completion_tokens >= 1
        streamed = ''.join(c.choices[0].text for c in client.completions.create(
            model='tiny', prompt=PROMPT, max_tokens=12, temperature=0, stream=True) if c.choices)
        assert streamed == greedy, (streamed, greedy)

        a = client.completions.create(model='tiny', prompt=PROMPT, max_tokens=8, n=3, seed=5)
        b = client.completions.create(model='tiny', prompt=PROMPT, max_tokens=8, n=3, seed=5)
        ta = [c.text for c in sorted(a.choices, key=lambda c: c.index)]
        assert ta == [c.text for c in sorted(b.choices, key=lambda c: c.index)] and len(set(ta)) > 1, ta

        stop = next(greedy[i:i + 2] for i in range(2, len(greedy) - 1) if greedy[i:i + 2].strip())
        r = client.completions.create(model='tiny', prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop])
        assert r.choices[0].text == greedy[:greedy.find(stop)] and r.choices[0].finish_reason == 'stop'

        r = client.completions.create(model='tiny', prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2)
        assert len(r.choices[0].logprobs.token_logprobs) == r.usage.completion_tokens

        msgs = [{'role': 'user', 'content': 'the quiet water'}]
        r = client.chat.completions.create(model='tiny', messages=msgs, max_tokens=8, temperature=0, logprobs=True,
                                           top_logprobs=2)
        content = r.choices[0].message.content
        assert r.choices[0].message.role == 'assistant' and len(r.choices[0].logprobs.content) == r.usage.completion_tokens
        chunks = list(client.chat.completions.create(model='tiny', messages=msgs, max_tokens=8, temperature=0,
                                                     stream=True, stream_options={'include_usage': True}))
        assert ''.join(c.choices[0].delta.content or '' for c in chunks if c.choices) == content
        assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens

        try:
            client.completions.create(model='tiny', prompt=PROMPT, max_tokens=-1)
            raise AssertionError('max_tokens -1 accepted')
        except openai.BadRequestError as e:
            assert e.body['param'] == 'max_tokens', e.body
        try:
            client.completions.create(model='gpt-4', prompt=PROMPT)
            raise AssertionError('unknown model accepted')
        except openai.NotFoundError:
            pass
    print('test_serve_openai: ok')


if __name__ == '__main__':
    sys.exit(main())
