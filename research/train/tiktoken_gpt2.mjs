// GPT-2 tokenizer for the training scripts: tiktoken's "gpt2" encoding (the
// reference tokenizer of ldlm), extended with ldlm's two added ids
// (pad = 50257, mask = 50258) on decode.
//
//   node tiktoken_gpt2.mjs encode < strings.jsonl > ids.jsonl
//   node tiktoken_gpt2.mjs decode < ids.jsonl > strings.jsonl
//
// One JSON value per line in and out: a string per line to encode, an array of
// ids per line to decode. Special-token text such as "<|endoftext|>" inside the
// input is encoded as ordinary text, never as the special id.
import { get_encoding } from "tiktoken";
import { createInterface } from "node:readline";

const PAD = 50257;
const MASK = 50258;
const mode = process.argv[2];
if (mode !== "encode" && mode !== "decode") {
  process.stderr.write("tiktoken_gpt2.mjs: usage: node tiktoken_gpt2.mjs encode|decode < in.jsonl > out.jsonl\n");
  process.exit(2);
}

const enc = get_encoding("gpt2");
const utf8 = new TextDecoder("utf-8", { fatal: false });
const out = [];
let lineNo = 0;

function flush() {
  if (out.length) process.stdout.write(out.join("\n") + "\n");
  out.length = 0;
}

function decodeIds(ids) {
  // Runs of ordinary ids decode together so that multi-byte characters split
  // across tokens come out whole; the added ids are shown by name.
  let text = "";
  let run = [];
  const finish = () => {
    if (run.length) text += utf8.decode(enc.decode(Uint32Array.from(run)));
    run = [];
  };
  for (const id of ids) {
    if (!Number.isInteger(id) || id < 0 || id > MASK) throw new Error(`line ${lineNo}: id ${id} is not in [0, ${MASK}]`);
    if (id === PAD || id === MASK) {
      finish();
      text += id === PAD ? "<|pad|>" : "<|mask|>";
    } else {
      run.push(id);
    }
  }
  finish();
  return text;
}

const rl = createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of rl) {
  lineNo++;
  const value = JSON.parse(line);
  if (mode === "encode") {
    if (typeof value !== "string") throw new Error(`line ${lineNo}: expected a JSON string`);
    out.push(JSON.stringify(Array.from(enc.encode(value, [], []))));
  } else {
    if (!Array.isArray(value)) throw new Error(`line ${lineNo}: expected a JSON array of ids`);
    out.push(JSON.stringify(decodeIds(value)));
  }
  if (out.length >= 4096) flush();
}
flush();
enc.free();
