#!/usr/bin/env python3
"""Renders OpenAI chat requests with the model's own Jinja chat template (Python's jinja2).

The goldens let //tokenizer:chat_template_golden_test (rendering, token for token) and
//tokenizer:chat_output_parser_test (parsing) check k3serve against an independent implementation. Usage (templates from llama.cpp's models/templates/, not
committed here):

  python3 make_chat_template_goldens.py --k3 Kimi-K3.jinja --kimi Kimi-K2-Instruct.jinja \
      > chat_template_goldens.json

The environment is the one Hugging Face transformers renders chat templates with: a sandbox (mutable: Kimi's template appends to a list) with
trim_blocks, lstrip_blocks and loop controls, raise_exception, and a `tojson` that does not escape
HTML (json.dumps with ensure_ascii as asked). An OpenAI request maps to the template's variables
as tokenizer/chat_template_golden_test.cc maps it:
  - tool_calls[].function.arguments: a JSON string that parses to an object is passed as that
    mapping (the model writes typed arguments), any other string as it is;
  - chat_template_kwargs are passed through; reasoning_effort is thinking_effort;
  - tools, tool_choice (when a string) and response_format are passed as they are.
"""
import argparse
import json
import sys

from jinja2.ext import loopcontrols
from jinja2.sandbox import SandboxedEnvironment


def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def raise_exception(message):
    raise ValueError(message)


def template_variables(request):
    messages = []
    for message in request["messages"]:
        message = json.loads(json.dumps(message))
        for call in message.get("tool_calls") or []:
            arguments = call["function"].get("arguments")
            if isinstance(arguments, str):
                try:
                    parsed = json.loads(arguments)
                except ValueError:
                    parsed = None
                if isinstance(parsed, dict):
                    call["function"]["arguments"] = parsed
        messages.append(message)
    variables = {"messages": messages, "add_generation_prompt": True}
    if request.get("tools"):
        variables["tools"] = request["tools"]
    if isinstance(request.get("tool_choice"), str):
        variables["tool_choice"] = request["tool_choice"]
    if "response_format" in request:
        variables["response_format"] = request["response_format"]
    if "reasoning_effort" in request:
        variables["thinking_effort"] = request["reasoning_effort"]
    variables.update(request.get("chat_template_kwargs", {}))
    return variables


def weather_tools():
    return [
        {"type": "function", "function": {
            "name": "get_weather", "description": "Weather for a city & day <today>.",
            "parameters": {"type": "object", "required": ["city"], "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
                "days": {"type": "integer", "minimum": 1},
                "Units": {"type": "string", "enum": ["metric", "imperial"]}}}}},
        {"type": "function", "function": {
            "name": "search", "description": "Searches the web.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}},
    ]


def tool_chat():
    return [
        {"role": "system", "content": "You are a careful agent."},
        {"role": "user", "content": "Weather in Paris and Köln? Also search \"café\"."},
        {"role": "assistant", "content": "", "reasoning_content": "I need two tools.",
         "tool_calls": [
             {"id": "call_a", "type": "function", "function": {
                 "name": "get_weather",
                 "arguments": json.dumps({"city": "Paris", "days": 3, "metric": True,
                                          "extra": None, "ratio": 0.5,
                                          "tags": ["a", "b"], "opts": {"z": 1, "a": "x"}})}},
             {"id": "call_b", "type": "function", "function": {
                 "name": "search", "arguments": "{\"q\": \"caf\\u00e9 <b> & \\\"x\\\"\\n\"}"}},
             {"id": "call_c", "type": "function", "function": {
                 "name": "search", "arguments": "not json at all"}},
         ]},
        {"role": "tool", "tool_call_id": "call_b", "content": "3 results"},
        {"role": "tool", "tool_call_id": "call_a", "content": "{\"temp\": 21}"},
        {"role": "tool", "tool_call_id": "call_c", "content": "none"},
        {"role": "assistant", "content": "Paris is 21°C.", "reasoning_content": "Summarize."},
        {"role": "user", "content": "Thanks. And now?"},
    ]


def cases():
    yield "k3", "plain", {"messages": [{"role": "user", "content": "Hello"}]}
    yield "k3", "thinking_off", {
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "Hi"},
                     {"role": "assistant", "content": "Hello!", "reasoning_content": "greet"},
                     {"role": "user", "content": "Bye"}],
        "chat_template_kwargs": {"thinking": False}}
    yield "k3", "effort_low_history", {
        "messages": [{"role": "user", "content": "Hi", "name": "a\"b&c"},
                     {"role": "assistant", "content": "Hello!"},
                     {"role": "user", "content": "  spaced  "}],
        "reasoning_effort": "low"}
    yield "k3", "effort_kwargs", {
        "messages": [{"role": "user", "content": "x"}],
        "chat_template_kwargs": {"thinking_effort": "medium"}}
    yield "k3", "tools_required", {
        "messages": tool_chat(), "tools": weather_tools(), "tool_choice": "required"}
    yield "k3", "tools_auto_thinking_off", {
        "messages": tool_chat(), "tools": weather_tools(), "tool_choice": "auto",
        "chat_template_kwargs": {"thinking": False}}
    yield "k3", "tool_choice_none", {
        "messages": [{"role": "user", "content": "Hi"}], "tools": weather_tools(),
        "tool_choice": "none"}
    yield "k3", "tool_results_unmatched", {
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "search", "arguments": "{\"q\": \"a\"}"}},
                {"id": "c2", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "other", "content": "r1"},
            {"role": "tool", "tool_call_id": "c2", "content": "r2"}],
        "tools": weather_tools()}
    yield "k3", "json_object", {
        "messages": [{"role": "user", "content": "JSON please"}],
        "response_format": {"type": "json_object"}}
    yield "k3", "json_schema", {
        "messages": [{"role": "user", "content": "A person"}],
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "person", "strict": True, "schema": {
                "type": "object", "additionalProperties": False, "required": ["name", "age"],
                "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                               "Tags": {"type": "array", "items": {"type": "string"}}}}}}}
    yield "kimi", "plain", {"messages": [{"role": "user", "content": "Hello"}]}
    yield "kimi", "system_history", {
        "messages": [{"role": "system", "content": "You are terse."},
                     {"role": "user", "content": "Hi", "name": "alice"},
                     {"role": "assistant", "content": "Hello!"},
                     {"role": "user", "content": "Bye"}]}
    yield "kimi", "tools", {"messages": tool_chat()[1:], "tools": weather_tools()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--k3", required=True, help="llama.cpp models/templates/Kimi-K3.jinja")
    parser.add_argument("--kimi", required=True,
                        help="llama.cpp models/templates/Kimi-K2-Instruct.jinja")
    args = parser.parse_args()
    env = SandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    templates = {}
    for family, path in (("k3", args.k3), ("kimi", args.kimi)):
        with open(path, encoding="utf-8") as f:
            templates[family] = env.from_string(f.read())
    goldens = []
    for family, name, request in cases():
        rendered = templates[family].render(**template_variables(request))
        goldens.append({"family": family, "name": name, "request": request,
                        "rendered": rendered})
    json.dump(goldens, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
