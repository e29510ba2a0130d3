"""Chat with tools through the official `openai` client, as agent frameworks use it: a forced
call read whole, the same streamed and put together from its deltas by index, and the tool's
result sent back in a second turn. Prints "ok" when every check holds."""

import json
import os
import sys

from openai import OpenAI

client = OpenAI(base_url=os.environ["SPECD_URL"] + "/v1", api_key="unused")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather forecast",
            "parameters": {
                "type": "object",
                "properties": {
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 9},
                },
                "required": ["unit", "days"],
            },
        },
    }
]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
COMMON = dict(
    model="specd",
    messages=MESSAGES,
    tools=TOOLS,
    tool_choice="required",
    parallel_tool_calls=False,
    max_tokens=200,
    temperature=0,
    extra_body={"chat_template_kwargs": {"enable_thinking": False}},
)


def check_args(name, arguments):
    assert name == "get_weather", name
    args = json.loads(arguments)
    assert args["unit"] in ("celsius", "fahrenheit"), args
    assert isinstance(args["days"], int) and 1 <= args["days"] <= 9, args
    return args


# Whole.
r = client.chat.completions.create(**COMMON)
choice = r.choices[0]
assert choice.finish_reason == "tool_calls", choice
calls = choice.message.tool_calls
assert calls, choice.message
for c in calls:
    assert c.type == "function" and c.id, c
    check_args(c.function.name, c.function.arguments)

# Streamed, accumulated by index.
acc = {}
finish = None
for chunk in client.chat.completions.create(stream=True, **COMMON):
    if not chunk.choices:
        continue
    delta = chunk.choices[0].delta
    for tc in delta.tool_calls or []:
        slot = acc.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
        if tc.id:
            slot["id"] = tc.id
        if tc.function and tc.function.name:
            slot["name"] += tc.function.name
        if tc.function and tc.function.arguments:
            slot["arguments"] += tc.function.arguments
    finish = chunk.choices[0].finish_reason or finish
assert finish == "tool_calls", finish
assert acc, "no streamed tool calls"
for i, slot in sorted(acc.items()):
    assert slot["id"], slot
    check_args(slot["name"], slot["arguments"])
# Greedy: the streamed calls are the whole answer's.
assert [(s["name"], json.loads(s["arguments"])) for _, s in sorted(acc.items())] == [
    (c.function.name, json.loads(c.function.arguments)) for c in calls
], (acc, calls)

# The tool's result goes back; the model answers (no tools forced this time).
first = calls[0]
follow = client.chat.completions.create(
    model="specd",
    messages=MESSAGES
    + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": first.id,
                    "type": "function",
                    "function": {"name": first.function.name, "arguments": first.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": first.id, "content": "sunny, 21 C"},
    ],
    tools=TOOLS,
    max_tokens=8,
    extra_body={"chat_template_kwargs": {"enable_thinking": False}},
)
assert follow.choices[0].message.role == "assistant", follow
print("ok")
sys.exit(0)
