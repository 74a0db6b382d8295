"""Reference pre-tokenizer splits for //tokenizer:reference_test.

Splits each corpus document with the K3 / Kimi release's pattern written exactly as the release
writes it (character-class intersection, which Python's `regex` module supports with its V1 flag),
so the C++ lookahead form is checked against the original.

    python3 k3_splits.py CORPUS OUT.json
"""
import json
import sys

import regex

PATTERN = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])


def main():
    corpus_path, out_path = sys.argv[1:]
    with open(corpus_path, encoding="utf-8", newline="") as f:
        documents = f.read().split("\n=====8<=====\n")
    pattern = regex.compile(PATTERN, regex.V1)
    splits = [pattern.findall(document) for document in documents]
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(splits, f)


if __name__ == "__main__":
    main()
