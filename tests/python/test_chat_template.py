#!/usr/bin/env python3
"""Our chat-template interpreter against jinja2, rendering the templates of tests/data/chat_templates/ (our own,
in the shapes of the Llama 3, Mistral, Qwen2 / ChatML and Gemma templates) with several message lists each. jinja2
is set up as transformers' apply_chat_template sets it up (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
raise_exception, strftime_now, a tojson without HTML escaping); where transformers is installed its own compiler is
used instead. Texts must be equal byte for byte; a case that fails in jinja2 must fail in ours, raise_exception's
message equal. JSON objects are given with sorted keys: ours sees them through nlohmann::json, which sorts them.
Skipped (exit 77, CTest's SKIP_RETURN_CODE) where jinja2 is not installed.

Usage: python3 tests/python/test_chat_template.py --render build/tests/chat_template_render
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

try:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError as e:
    print(f"SKIP: needs jinja2 ({e})")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "..", "data", "chat_templates")


class RaisedByTemplate(Exception):
    pass


def compile_template(source):
    try:  # transformers' own environment where it is installed
        from transformers.utils.chat_template_utils import _compile_jinja_template
        return _compile_jinja_template(source), "transformers"
    except ImportError:
        pass

    def raise_exception(message):
        raise RaisedByTemplate(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(source), "jinja2 " + jinja2.__version__


def user(text):
    return {"content": text, "role": "user"}


def assistant(text):
    return {"content": text, "role": "assistant"}


def system(text):
    return {"content": text, "role": "system"}


WEATHER = {"function": {"description": "Weather at a place", "name": "get_weather",
                        "parameters": {"properties": {"city": {"type": "string"}}, "required": ["city"],
                                       "type": "object"}, "return": {"type": "string"}}, "type": "function"}
CALL = {"function": {"arguments": {"city": "Paris"}, "name": "get_weather"}, "id": "abc123XYZ", "type": "function"}
CHAT = [user("Hello!"), assistant(" Hi, how can I help? "), user("Tell me a joke\nplease.")]
BASE = {"bos_token": "<s>", "eos_token": "</s>"}

CASES = {
    "chatml.jinja": [
        (CHAT, True, BASE),
        ([system("You are terse.")] + CHAT, False, BASE),
        ([user("Weather in Paris?"), {"content": "", "role": "assistant", "tool_calls": [CALL, CALL]},
          {"content": "21C", "role": "tool"}, {"content": "sunny", "role": "tool"}], True, dict(BASE, tools=[WEATHER])),
        ([user("ünïcödé ✓ \"quotes\" and \\ backslash")], True, BASE),
    ],
    "llama3.jinja": [
        (CHAT, True, dict(BASE, date_string="26 Jul 2024")),
        ([system("  Be kind.  ")] + CHAT, False, dict(BASE, date_string="26 Jul 2024")),
        ([user("Weather?")], True, dict(BASE, date_string="01 Feb 2025", tools=[WEATHER])),
        ([system("sys"), user("Weather?")], True, dict(BASE, date_string="01 Feb 2025", tools=[WEATHER],
                                                       tools_in_user_message=False)),
        ([user("Search it"), {"content": None, "role": "assistant", "tool_calls": [
            {"function": {"arguments": {"query": "llamas"}, "name": "brave_search"}}]},
          {"content": {"result": "many"}, "role": "ipython"}], True,
         dict(BASE, date_string="01 Feb 2025", builtin_tools=["brave_search", "code_interpreter"])),
        ([user("a"), {"content": None, "role": "assistant", "tool_calls": [CALL, CALL]}], False,
         dict(BASE, date_string="01 Feb 2025")),
        ([], True, dict(BASE, date_string="01 Feb 2025", tools=[WEATHER])),
    ],
    "mistral.jinja": [
        (CHAT, False, BASE),
        ([system("Answer in French.")] + CHAT, False, BASE),
        ([user("Weather in Paris?"), {"content": None, "role": "assistant", "tool_calls": [CALL]},
          {"content": "21C", "role": "tool", "tool_call_id": "abc123XYZ"}, assistant("It is 21C."),
          user("Thanks")], False, dict(BASE, tools=[WEATHER])),
        ([user("a"), user("b")], False, BASE),
        ([user("x"), {"content": None, "role": "assistant", "tool_calls": [dict(CALL, id="short")]}], False, BASE),
    ],
    "gemma.jinja": [
        (CHAT, True, BASE),
        (CHAT[:2], False, BASE),
        ([system("no")] + CHAT, True, BASE),
        ([assistant("first")], True, BASE),
    ],
    "constructs.jinja": [
        ([system("  be brief  "), {"content": [{"text": "look", "type": "text"}, {"text": "here", "type": "text"}],
                                   "role": "user"}, {"content": None, "role": "assistant"}], True, BASE),
        (CHAT, False, dict(BASE, x=1)),
    ],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--render", required=True, help="the chat_template_render executable")
    a = ap.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, cases in CASES.items():
            path = os.path.join(TEMPLATES, name)
            with open(path, encoding="utf-8") as f:
                template, engine = compile_template(f.read())
            cases_path = os.path.join(tmp, "cases.json")
            with open(cases_path, "w", encoding="utf-8") as f:
                json.dump([{"messages": m, "add_generation_prompt": g, "variables": v} for m, g, v in cases], f,
                          sort_keys=True)
            ours = json.loads(subprocess.run([a.render, path, cases_path], check=True, capture_output=True,
                                             text=True, encoding="utf-8").stdout)
            for i, ((messages, gen, variables), got) in enumerate(zip(cases, ours)):
                try:
                    want = {"text": template.render(messages=messages, add_generation_prompt=gen, **variables)}
                except (RaisedByTemplate, jinja2.TemplateError) as e:
                    want = {"error": str(e), "raised": isinstance(e, RaisedByTemplate)}
                if "text" in want:
                    ok = got.get("text") == want["text"]
                else:  # an error in both; raise_exception's message must come through unchanged
                    ok = "error" in got and (not want["raised"] or got["error"] == want["error"])
                failures += not ok
                print(f"{'PASS' if ok else 'FAIL'} {name} case {i} ({engine})")
                if not ok:
                    print(f"  jinja2: {want!r}\n  ours:   {got!r}")
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
