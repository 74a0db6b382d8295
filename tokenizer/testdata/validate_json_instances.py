#!/usr/bin/env python3
"""Validates (schema, instance) pairs with python3-jsonschema, the independent check of
//tokenizer:json_grammar_test. Reads JSON lines {"schema": ..., "instance": "<text>"}; prints one
line per pair that does not validate and exits 1 if there was any."""
import json
import sys

import jsonschema

bad = 0
for line in open(sys.argv[1], encoding="utf-8"):
    pair = json.loads(line)
    try:
        instance = json.loads(pair["instance"])
        jsonschema.Draft202012Validator(pair["schema"]).validate(instance)
    except (ValueError, jsonschema.ValidationError) as error:
        bad += 1
        print(f"INVALID {pair['instance']!r} for {json.dumps(pair['schema'])}: {error}")
sys.exit(1 if bad else 0)
