#!/usr/bin/env python3
"""Validates (schema, instance) pairs with python3-jsonschema, the independent check of
//tokenizer:json_grammar_test and //tests:http_front_test. Reads JSON lines {"schema": ...,
"instance": "<text>"} or {"schema": ..., "instance_hex": "<the text's bytes in hex>"} (bytes that
may not be UTF-8 at all); prints one line per pair that does not validate and exits 1 if there
was any. An instance must be strict UTF-8 and hold no lone surrogate (a "\\ud800" escape decodes
to one, which no UTF-8 text can carry); string lengths are counted in code points, as Python's
len() and jsonschema count them."""
import json
import sys

import jsonschema

bad = 0
for line in open(sys.argv[1], encoding="utf-8"):
    pair = json.loads(line)
    try:
        if "instance_hex" in pair:
            text = bytes.fromhex(pair["instance_hex"]).decode("utf-8")  # strict: no overlong form
        else:
            text = pair["instance"]
        instance = json.loads(text)
        json.dumps(instance, ensure_ascii=False).encode("utf-8")  # raises on a lone surrogate
        jsonschema.Draft202012Validator(pair["schema"]).validate(instance)
    except (ValueError, jsonschema.ValidationError) as error:
        bad += 1
        shown = pair.get("instance", pair.get("instance_hex"))
        print(f"INVALID {shown!r} for {json.dumps(pair['schema'])}: {error}")
sys.exit(1 if bad else 0)
