#!/usr/bin/env python3
"""Render chat bodies with Qwen3.5's own chat template, for kore-tokenizer's tests.

The template is fetched reproducibly from PyPI: `llama-cpp-python` 0.3.36's sdist vendors
llama.cpp 0c1e570, whose `models/templates/Qwen3.5-4B.jinja` is the Qwen3.5 chat template
(its SHA-256 is checked below and written into the fixture). Each body (an OpenAI chat request:
`messages`, optional `tools` and `chat_template_kwargs`) is rendered with transformers'
`render_jinja_template`, the function behind `apply_chat_template`, into
appliance/tokenizer/tests/data/chat_template_qwen35.json: `{"name", "body", "text"}` or
`{"name", "body", "error"}` where the template raises.

As an OpenAI-compatible server must, `tool_calls[].function.arguments` (a JSON string on the
wire) is decoded into an object, keys in their order, before rendering: the template iterates
it with `|items`. A `content` list of text parts is kept as it is (the template joins them).

With QWEN35_TOKENIZER_JSON (scripts/tokenizer/make_qwen_tokenizer.sh makes it), each rendered
text also gets `ids`: Hugging Face `tokenizers`' encoding of it, what `apply_chat_template`
with `tokenize=True` returns.

Needs: pip install transformers jinja2 tokenizers scikit-build-core cmake (the sdist's metadata
step needs the last two; nothing is built).
Usage: gen_chat_template_fixtures.py [SDIST_DIR [QWEN35_TOKENIZER_JSON]]
"""

import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from transformers.utils.chat_template_utils import render_jinja_template

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "appliance/tokenizer/tests/data/chat_template_qwen35.json"
SDIST = "llama_cpp_python-0.3.36.tar.gz"
MEMBER = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/Qwen3.5-4B.jinja"
TEMPLATE_SHA256 = "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715"


def fetch_template(folder: Path) -> str:
    sdist = folder / SDIST
    if not sdist.exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "llama-cpp-python==0.3.36", "--no-binary",
             ":all:", "--no-deps", "--no-build-isolation", "-d", str(folder)],
            check=True)
    with tarfile.open(sdist) as tar:
        text = tar.extractfile(MEMBER).read().decode("utf-8")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if digest != TEMPLATE_SHA256:
        raise SystemExit(f"template sha256 {digest}, expected {TEMPLATE_SHA256}")
    return text


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city. Quotes \"here\", a backslash \\ and <b>tags</b> & more.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich or 東京"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14, "default": 1},
            },
            "required": ["city"],
        },
    },
}

SEARCH = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "number", "exclusiveMinimum": 0.5, "multipleOf": 1e-05,
                          "maximum": 1e20, "examples": [2.5, -0.0, 123456789012345678901234567890]},
                "filters": {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}}},
                            "additionalProperties": False},
                "exact": {"type": "boolean"},
                "note": {"type": ["string", "null"], "description": "tab\there, newline\nthere, bell\u0007, del\u007f"},
            },
            "required": ["query", "limit"],
        },
        "strict": True,
    },
}

# A tool in the bare form (no "type"/"function" wrapper), which the template prints as given.
BARE = {"name": "now", "description": "The time.", "parameters": {"type": "object", "properties": {}}}


def call(name, args, wrap=True, idx=0):
    fn = {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}
    return {"id": f"call_{idx}", "type": "function", "function": fn} if wrap else fn


BODIES = [
    ("user_only_thinking", {"messages": [{"role": "user", "content": "Hello!"}]}),
    ("user_only_no_thinking", {"messages": [{"role": "user", "content": "Hello!"}],
                               "chat_template_kwargs": {"enable_thinking": False}}),
    ("system_and_user", {"messages": [{"role": "system", "content": "  Be terse.\n"},
                                      {"role": "user", "content": " Why is the sky blue? 空はなぜ青い？ "}]}),
    ("empty_system", {"messages": [{"role": "system", "content": ""},
                                   {"role": "user", "content": "hi"}]}),
    ("tools_no_system", {"tools": [WEATHER], "messages": [{"role": "user", "content": "Weather in Paris?"}]}),
    ("tools_with_system", {"tools": [WEATHER, SEARCH, BARE],
                           "messages": [{"role": "system", "content": "You are a helpful agent.\n\n"},
                                        {"role": "user", "content": "Find docs."}],
                           "chat_template_kwargs": {"enable_thinking": False}}),
    ("tools_blank_system", {"tools": [BARE], "messages": [{"role": "system", "content": "  \n"},
                                                          {"role": "user", "content": "time?"}]}),
    ("one_call_and_result", {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "reasoning_content": "Need the tool.",
         "tool_calls": [call("get_weather", {"city": "Paris", "unit": "celsius", "days": 3})]},
        {"role": "tool", "tool_call_id": "call_0", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
    ]}),
    ("parallel_calls_typed_values", {"tools": [WEATHER, SEARCH], "messages": [
        {"role": "system", "content": "Sys."},
        {"role": "user", "content": "Do both."},
        {"role": "assistant", "content": "I'll call two tools.",
         "tool_calls": [
             call("get_weather", {"city": "Zürich", "days": 2}, idx=0),
             call("search_docs", {"query": "line one\nline \"two\"", "limit": 2.5, "exact": True,
                                  "note": None, "filters": {"tags": ["a", "b\\c"], "n": [1, 1.0, -0.0, 1e-7]},
                                  "big": 1e16, "neg": -3, "f": False}, idx=1),
         ]},
        {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "doc "},
                                                               {"type": "text", "text": "list"}]},
        {"role": "assistant", "content": "<think>\nSummarise.\n</think>\n\nIt is sunny; docs found."},
        {"role": "user", "content": "Thanks. Again?"},
    ], "chat_template_kwargs": {"enable_thinking": True}}),
    ("multi_step_tool_turns", {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Compare Oslo and Rome."},
        {"role": "assistant", "content": "", "reasoning_content": "First Oslo.",
         "tool_calls": [call("get_weather", {"city": "Oslo"}, wrap=False)]},
        {"role": "tool", "content": "cold"},
        {"role": "assistant", "content": "Now Rome.", "reasoning_content": "\nThen Rome.\n",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\", \"days\": 1}"}}]},
        {"role": "tool", "content": "warm"},
    ], "chat_template_kwargs": {"enable_thinking": False}}),
    ("reasoning_kept_only_after_last_query", {"messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Simple sum."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "<think>\nagain\n</think>\n\n  6"},
        {"role": "assistant", "content": "text with </think> inside", "reasoning_content": "kept as given"},
    ]}),
    ("think_split_edge_cases", {"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think>a</think>b</think>\n\nc"},
        {"role": "assistant", "content": "no think open</think>tail"},
    ], "chat_template_kwargs": {"enable_thinking": False}}),
    ("user_tool_wrapper_is_not_a_query", {"messages": [
        {"role": "user", "content": "real question"},
        {"role": "assistant", "content": "calling", "reasoning_content": "r1"},
        {"role": "user", "content": "<tool_response>\nresult\n</tool_response>"},
        {"role": "assistant", "content": "done", "reasoning_content": "r2"},
    ]}),
    ("tool_first_message", {"messages": [
        {"role": "tool", "content": "orphan"},
        {"role": "user", "content": "hi"},
    ]}),
    ("content_parts", {"messages": [
        {"role": "system", "content": [{"type": "text", "text": "Part A. "}, {"type": "text", "text": "Part B."}]},
        {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]},
    ]}),
    ("whitespace_and_controls", {"messages": [
        {"role": "user", "content": "\u001f\t tabs\tand \u3000ideographic\u3000 \n"},
        {"role": "assistant", "content": "\n\nanswer\r\n", "reasoning_content": "  "},
        {"role": "user", "content": "ok\u0085"},
    ]}),
    ("error_no_user_query", {"messages": [{"role": "system", "content": "s"}]}),
    ("error_system_not_first", {"messages": [{"role": "user", "content": "u"},
                                             {"role": "system", "content": "s"}]}),
]


def decode_arguments(messages):
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                c = json.loads(json.dumps(c))
                fn = c.get("function", c)
                if isinstance(fn.get("arguments"), str):
                    fn["arguments"] = json.loads(fn["arguments"])
                calls.append(c)
            m["tool_calls"] = calls
        out.append(m)
    return out


def render(template: str, body: dict) -> str:
    kwargs = dict(body.get("chat_template_kwargs", {}))
    return render_jinja_template(
        conversations=[decode_arguments(body["messages"])],
        tools=body.get("tools"),
        chat_template=template,
        add_generation_prompt=True,
        **kwargs,
    )[0][0]


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp())
    folder.mkdir(parents=True, exist_ok=True)
    template = fetch_template(folder)
    encode = None
    if len(sys.argv) > 2:
        from tokenizers import Tokenizer
        encode = Tokenizer.from_file(sys.argv[2]).encode
    cases = []
    for name, body in BODIES:
        try:
            text = render(template, body)
        except Exception as e:  # the template's raise_exception
            cases.append({"name": name, "body": body, "error": str(e)})
            continue
        case = {"name": name, "body": body, "text": text}
        if encode:
            case["ids"] = encode(text).ids
        cases.append(case)
    doc = {"template": MEMBER, "sha256": hashlib.sha256(template.encode()).hexdigest(), "cases": cases}
    OUT.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
