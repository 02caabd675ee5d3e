# SPDX-License-Identifier: MIT
"""Structured output against a live `megascope serve` on SmolLM2-135M-Instruct,
through the clients applications use: the official openai SDK (its parse
helper, json_object, json_schema streamed and not, n > 1) and LangChain's
with_structured_output (json_schema and json_mode). Each answer must parse and
match its schema; the same question without response_format must not be JSON
(so these checks can fail); tool calls are refused with the reason, and a
schema llguidance cannot use is a 400 that says why.

usage: structured_client.py URL"""
import json
import sys
from typing import Literal

import openai
from pydantic import BaseModel, Field

URL = sys.argv[1]
client = openai.OpenAI(base_url=URL + "/v1", api_key="none", max_retries=0, timeout=300)
MODEL = client.models.list().data[0].id
passed = failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL: %s %s" % (name, detail))


class Person(BaseModel):
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=150)
    colour: Literal["red", "green", "blue"]


ASK = [{"role": "user", "content": "Alice is 30 years old and her favourite colour is green. Describe her."}]
ASK_JSON = [{"role": "user", "content": "Alice is 30 years old and her favourite colour is green. "
                                         "Describe her as JSON with the keys name, age and colour."}]


def is_json(s):
    try:
        json.loads(s)
        return True
    except ValueError:
        return False


# without a constraint the model writes prose: the checks below can fail
free = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=60, temperature=0)
check("unconstrained is prose", not is_json(free.choices[0].message.content), repr(free.choices[0].message.content))

# json_object: any JSON object (asked for in the prompt, as OpenAI requires of json_object)
r = client.chat.completions.create(model=MODEL, messages=ASK_JSON, max_tokens=160, temperature=0,
                                   response_format={"type": "json_object"})
text = r.choices[0].message.content
check("json_object parses", is_json(text) and isinstance(json.loads(text), dict), repr(text))
check("json_object ends at the end of turn", r.choices[0].finish_reason == "stop", r.choices[0].finish_reason)

# json_schema, strict, through the SDK's parse helper (pydantic in, pydantic out)
parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
p = parse(model=MODEL, messages=ASK, response_format=Person, max_tokens=120, temperature=0)
got = p.choices[0].message.parsed
check("parse helper", isinstance(got, Person), repr(p.choices[0].message.content))
print("parse helper:", p.choices[0].message.content)

# json_schema streamed: the deltas joined are the schema's JSON
schema = {"type": "json_schema", "json_schema": {"name": "person", "schema": Person.model_json_schema(), "strict": True}}
chunks = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=120, temperature=0, stream=True,
                                        response_format=schema)
streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
try:
    Person.model_validate_json(streamed)
    ok = True
except ValueError:
    ok = False
check("json_schema streamed", ok, repr(streamed))
check("streamed equals non-streamed", streamed == p.choices[0].message.content, repr(streamed))

# several choices, sampled: each its own matcher
r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=120, temperature=0.9, seed=7, n=3,
                                   response_format=schema)
for i, c in enumerate(r.choices):
    try:
        Person.model_validate_json(c.message.content)
        ok = True
    except ValueError:
        ok = False
    check("n=3 choice %d" % i, ok, repr(c.message.content))

# LangChain, as agent frameworks call it
from langchain_openai import ChatOpenAI  # noqa: E402

llm = ChatOpenAI(base_url=URL + "/v1", api_key="none", model=MODEL, temperature=0, max_tokens=120, max_retries=0)
out = llm.with_structured_output(Person, method="json_schema").invoke(ASK[0]["content"])
check("langchain json_schema", isinstance(out, Person), repr(out))
out = llm.with_structured_output(Person.model_json_schema(), method="json_mode").invoke(ASK_JSON[0]["content"])
check("langchain json_mode", isinstance(out, dict), repr(out))
print("langchain:", out)
try:
    llm.with_structured_output(Person, method="function_calling").invoke(ASK[0]["content"])
    check("langchain function_calling refused", False, "it answered")
except openai.BadRequestError as e:
    check("langchain function_calling refused", "tool calls are not served" in str(e), str(e))

# tools: refused with the reason
tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
try:
    client.chat.completions.create(model=MODEL, messages=ASK, tools=tools)
    check("tools refused", False, "it answered")
except openai.BadRequestError as e:
    check("tools refused", "tool calls are not served" in str(e) and e.body["param"] == "tools", str(e))

# a schema the grammar engine cannot use: 400 naming why
bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
    "a": {"type": "nosuchtype"}}}}}
try:
    client.chat.completions.create(model=MODEL, messages=ASK, response_format=bad, max_tokens=8)
    check("bad schema refused", False, "it answered")
except openai.BadRequestError as e:
    check("bad schema refused", "schema cannot be used" in str(e) and e.body["param"] == "response_format", str(e))
try:
    client.chat.completions.create(model=MODEL, messages=ASK, response_format={"type": "xml"}, max_tokens=8)
    check("unknown type refused", False, "it answered")
except openai.BadRequestError as e:
    check("unknown type refused", "expected text, json_object or json_schema" in str(e), str(e))

# completions take it too (vLLM's and llama-server's extension)
r = client.completions.create(model=MODEL, prompt='{"name": "Bob", "age": 4', max_tokens=40, temperature=0,
                              extra_body={"response_format": {"type": "json_object"}})
check("completions json_object", is_json(r.choices[0].text), repr(r.choices[0].text))

print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
