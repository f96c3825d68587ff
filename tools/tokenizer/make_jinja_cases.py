#!/usr/bin/env python3
"""Small Jinja templates rendered by jinja2 (set up as transformers does), one feature each:
tests/fixtures/tokenizer/jinja_cases.jsonl with {"template", "context", "expected"} or
{"template", "context", "error": true} when jinja2 raises. They pin the interpreter's semantics
(scoping, whitespace control, Python value printing, filters, tests, methods) beyond what the
real chat templates happen to use.

  python3 tools/tokenizer/make_jinja_cases.py     # needs only jinja2
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_chat_fixtures import FIXTURES, ROOT, jinja2_environment  # noqa: E402

CASES = [
    # scoping: set in a loop body is per iteration and does not leak; set in if does
    ("{% set x = 0 %}{% for i in range(3) %}{{ x }}{% set x = x + 1 %}{{ x }},{% endfor %}|{{ x }}", {}),
    ("{% for i in range(3) %}{% if i == 0 %}{% set y = 5 %}{% endif %}{{ y }},{% endfor %}", {}),
    ("{% if true %}{% set z = 3 %}{% endif %}{{ z }}", {}),
    ("{%- set ns = namespace(a=1, b='x') %}{% for i in [1, 2, 3] %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}{{ ns.b }}", {}),
    ("{% set a, b = 1, 2 %}{{ a }}{{ b }}", {}),
    ("{% set t %}block {{ 1 + 1 }}{% endset %}[{{ t }}]", {}),
    ("{% with a = 5, b = 6 %}{{ a * b }}{% endwith %}{{ a }}", {}),
    # printing Python values
    ("{{ [1, 'a', none, true, 1.0, {'k': [1]}] }} {{ (1, 2) }} {{ (1,) }} {{ 1e20 }} {{ 1e-5 }}", {}),
    ("{{ 10 / 4 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 'a' ~ 1 ~ none }}", {}),
    ("{{ 3.0 }} {{ 0.1 + 0.2 }} {{ 1 / 3 }} {{ 100000000000000000.0 }} {{ -0.0 }} {{ 1234567890123456.0 }} {{ 0.0001 }} {{ 123e-20 }}", {}),
    ("{{ 'a\\'b' }} {{ \"it's\" }} {{ ['it\\'s', 'a\"b', \"x'y\\\"z\", 'tab\\there', 'nl\\n'] }}", {}),
    ("{{ x }}|{{ x.a }}|{{ x['b'] }}|{{ x.c is defined }}", {"x": {"a": 1, "b": [1, 2]}}),
    # undefined
    ("{{ missing }}|{{ missing | length }}|{{ missing is defined }}|{% for a in missing %}1{% endfor %}|{{ missing | default('d') }}", {}),
    ("{{ missing.attr }}", {}),
    ("{{ x.y.z }}", {"x": {}}),
    ("{{ missing + 1 }}", {}),
    ("{{ 1 if false }}|{{ [1, 2][5] }}|{{ {'a': 1}['b'] }}|{{ 'abc'[10] }}", {}),
    # operators and comparisons
    ("{{ true + 1 }} {{ 'a' * 3 }} {{ [1] + [2] }} {{ 3 in [1, 2, 3] }} {{ 'b' in 'abc' }} {{ 'a' in {'a': 1} }} {{ 4 not in [1] }}", {}),
    ("{{ 1 == 1.0 }} {{ true == 1 }} {{ none == none }} {{ 'a' < 'b' }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ [1, 2] == [1, 2] }} {{ {'a': 1} == {'a': 1} }}", {}),
    ("{{ 'x' + 1 }}", {}),
    ("{{ 1 < 'a' }}", {}),
    ("{{ not true or false and true }} {{ none or 'fallback' }} {{ 0 and 'no' }} {{ 'yes' and 'also' }}", {}),
    ("{{ -3 | abs }} {{ - 2 ** 2 }} {{ (1 + 2) * 3 }} {{ 1 + 2 * 3 }} {{ 2 * 3 ~ 4 }}", {}),
    # strings: slicing, indexing, methods
    ("{{ 'abc'[::-1] }} {{ 'héllo'[1] }} {{ 'héllo' | length }} {{ 'abcdef'[1:4] }} {{ 'abc'[-2:] }} {{ [1, 2, 3][1:] }} {{ (1, 2, 3)[::2] }}", {}),
    ("{{ 'a,b,,c'.split(',') }} {{ ' x  y  '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a-b-c'.rsplit('-', 1) }} {{ '  x '.strip() }} {{ 'xxhixx'.strip('x') }} {{ '\\n\\nhi\\n'.lstrip('\\n') }}", {}),
    ("{{ 'abc'.upper() }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }} {{ 'ABC'.lower() }} {{ 'ÉCOLE'.lower() }}", {}),
    ("{{ 'ab'.startswith('a') }} {{ 'ab'.startswith(('x', 'a')) }} {{ 'ab'.endswith('b') }} {{ 'abcb'.replace('b', 'X') }} {{ 'abcb'.replace('b', 'X', 1) }} {{ 'abcb'.find('c') }} {{ 'abcb'.rfind('b') }} {{ 'abcb'.count('b') }}", {}),
    ("{{ 'a\\nb\\r\\nc'.splitlines() }} {{ ', '.join(['a', 'b']) }} {{ '123'.isdigit() }} {{ 'ab1'.isalpha() }} {{ '{} and {}'.format(1, 'x') }}", {}),
    ("{{ '</think>' in content }}|{{ content.split('</think>')[-1].lstrip('\\n') }}|{{ content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}", {"content": "<think>\nreason\n</think>\n\nanswer"}),
    # filters
    ("{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ {'b': 1, 'a': 2} | dictsort }} {{ [1, 2] | reverse | list }}", {}),
    ("{{ {'b': 1, 'a': [1, 2, 'é\"'], 'c': none, 'd': true, 'e': 1.5} | tojson }}", {}),
    ("{{ {'a': 1, 'b': [1, {'c': []}], 'd': {}} | tojson(indent=2) }}", {}),
    ("{{ x | tojson }} {{ x | tojson(indent=4) }}", {"x": {"z": 1, "y": "\u2028\t\u007f/"}}),
    ("{{ [1, 2, 3] | join(', ') }} {{ [1, 2] | first }} {{ [1, 2] | last }} {{ none | default('d') }} {{ '' | default('d', true) }} {{ 'abc' | list }}", {}),
    ("{{ '  x  ' | trim }}|{{ 'x' | indent(2) }}|{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ '<b>&' | e }}|{{ 'a b c' | wordcount }}", {}),
    ("{{ [{'a': 1}, {'a': 2}, {'b': 3}] | selectattr('a', 'defined') | map(attribute='a') | list }} {{ [1, 2, 3, 4] | select('even') | list }} {{ [1, 2, 3] | reject('odd') | list }} {{ [{'r': 'u'}, {'r': 's'}] | rejectattr('r', 'equalto', 's') | list }}", {}),
    ("{{ x | items | list }} {{ [1, 2, 2] | unique | list }} {{ [3, 1] | max }} {{ [3, 1] | min }} {{ [1, 2] | sum }} {{ [1, 2] | map('string') | join('-') }}", {"x": {"a": 1}}),
    ("{{ '3' | int + 1 }} {{ '3.7' | int }} {{ 'x' | int }} {{ 7 | float }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.567 | round(2) }} {{ 2.5 | round(0, 'floor') }} {{ 1 | string ~ 2 }} {{ 'x' | upper }} {{ 'Hi' | lower }}", {}),
    ("{{ messages | length }} {{ messages[0].content | length }} {{ messages | map(attribute='role') | join(',') }} {{ messages | selectattr('role', 'equalto', 'user') | list | length }}", {"messages": [{"role": "user", "content": "héllo"}, {"role": "assistant", "content": "x"}]}),
    # tests
    ("{{ x is string }} {{ x is mapping }} {{ l is iterable }} {{ l is sequence }} {{ 1 is number }} {{ 1.0 is integer }} {{ none is none }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 2 is in [1, 2] }} {{ 'a' is lower }} {{ true is boolean }} {{ x is not defined }}", {"x": "s", "l": [1]}),
    ("{{ x is sameas none }} {{ x is none }} {{ y is true }} {{ y is false }} {{ 5 is gt 3 }} {{ 5 is le 3 }} {{ 5 is eq 5 }}", {"x": None, "y": True}),
    # loops
    ("{% for a in [1, 2, 3] if a > 1 %}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{% else %}empty{% endfor %}", {}),
    ("{% for a in [] %}x{% else %}empty{% endfor %}", {}),
    ("{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% if i == 3 %}{% break %}{% endif %}{% endfor %}", {}),
    ("{% for x in [1, 2] %}{% for y in [3, 4] %}{{ loop.index }}{{ x }}{{ y }} {% endfor %}{{ loop.revindex }}{% endfor %}", {}),
    ("{% for k, v in x.items() %}{{ k }}={{ v }};{% endfor %} {{ x.keys() | list }} {{ x.values() | list }} {{ x.get('q', 5) }} {{ x.get('a') }}", {"x": {"b": 1, "a": 2}}),
    ("{% for c in 'héllo' %}[{{ c }}]{% endfor %}{% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}", {}),
    ("{% for m in msgs[::-1] %}{{ loop.index0 }}{{ m }}{{ loop.previtem }}{{ loop.nextitem }}|{% endfor %}{{ loop }}", {"msgs": ["a", "b", "c"]}),
    ("{% for i in range(1, 10, 3) %}{{ i }}{{ loop.cycle('a', 'b') }}{% endfor %}", {}),
    # macros
    ("{% macro f(a, b='x') %}[{{ a }}{{ b }}]{% endmacro %}{{ f(1) }}{{ f(2, b='y') }}{{ f(b='z', a=3) }}", {}),
    ("{% set g = 'top' %}{% macro m() %}{{ g }}{% endmacro %}{{ m() }}", {}),
    # whitespace control (trim_blocks, lstrip_blocks, -, +)
    ("  {% if true %}\n  yes\n  {% endif %}\n  after", {}),
    ("{%- for m in msgs -%}\n  {{ m }}\n{%- endfor %}\n", {"msgs": [1, 2]}),
    ("a\n{# comment #}\nb\n  {# c2 #}  \nc\n", {}),
    ("x  {%- if true %} y {% endif -%}  \n z {{- ' w ' -}} v", {}),
    ("<ul>\n    {% for i in [1, 2] %}\n    <li>{{ i }}</li>\n    {% endfor %}\n</ul>\n", {}),
    ("a {%+ if true %}b{% endif %}\n  {%+ if true %}c{% endif +%}\nd", {}),
    ("{% if x %}\nX\n{% elif y %}\nY\n{% else %}\nZ\n{% endif %}\n", {"y": 1}),
    ("{{ '{{' }} {% raw %}{{ not parsed }} {% if %}{% endraw %} done", {}),
    ("line1\r\nline2\r\n{{ 'x' }}\r\n", {}),
    # errors
    ("{{ raise_exception('boom') }}", {}),
    ("{{ [1, 2].append(3) }}", {}),
]


def main():
    env = jinja2_environment()
    out_path = os.path.join(FIXTURES, "jinja_cases.jsonl")
    with open(out_path, "w", encoding="utf-8", newline="\n") as out:
        for template, context in CASES:
            row = {"template": template, "context": context}
            try:
                row["expected"] = env.from_string(template).render(**context)
            except Exception as e:  # noqa: BLE001 - any jinja2 error means "must fail"
                row["error"] = True
                row["jinja2_error"] = f"{type(e).__name__}: {e}"
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(CASES)} cases to {os.path.relpath(out_path, ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
