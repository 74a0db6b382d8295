// Reference ids for //tokenizer:reference_test from js-tiktoken, which carries OpenAI's
// cl100k_base and o200k_base ranks and split patterns.
//
//   node encode.mjs CORPUS OUT_DIR
//
// For each encoding E writes OUT_DIR/E.tiktoken (the ranks in tiktoken.model form),
// OUT_DIR/E.pattern (the split pattern) and OUT_DIR/E.ids.json (the ids of each corpus document,
// special-token names encoded as ordinary text).
import { readFileSync, writeFileSync } from "node:fs";
import { Tiktoken } from "js-tiktoken/lite";
import cl100k_base from "js-tiktoken/ranks/cl100k_base";
import o200k_base from "js-tiktoken/ranks/o200k_base";

const [corpusPath, outDir] = process.argv.slice(2);
const documents = readFileSync(corpusPath, "utf8").split("\n=====8<=====\n");

for (const [name, ranks] of Object.entries({ cl100k_base, o200k_base })) {
  // bpe_ranks lines: "<prefix> <first rank> <base64 token> <base64 token> ...", ranks consecutive.
  const lines = [];
  for (const line of ranks.bpe_ranks.split("\n").filter(Boolean)) {
    const [, offset, ...tokens] = line.split(" ");
    tokens.forEach((token, i) => lines.push(`${token} ${Number.parseInt(offset, 10) + i}`));
  }
  writeFileSync(`${outDir}/${name}.tiktoken`, lines.join("\n") + "\n");
  writeFileSync(`${outDir}/${name}.pattern`, ranks.pat_str);
  const encoder = new Tiktoken(ranks);
  const ids = documents.map((document) => encoder.encode(document, [], []));
  writeFileSync(`${outDir}/${name}.ids.json`, JSON.stringify(ids));
}
