// Measures tiktoken's gpt2 encoding (the npm WASM build of OpenAI's Rust tokenizer) on
// one UTF-8 file, to compare with ldlm's BM_TokenizerEncode on the same file.
//   npm ci && node bench_tiktoken.mjs TEXT_FILE [--repeat N] [--ids OUT]
// Prints bytes, tokens and MB/s (1 MB = 1e6 bytes) of each run, by wall time and by the
// process's CPU time (less sensitive to other load on the machine); --ids writes the
// ids, one line, for a parity check against `ldlm tokenize`.
import { readFileSync, writeFileSync } from "node:fs";
import { get_encoding } from "tiktoken";

const args = process.argv.slice(2);
const file = args[0];
if (!file) {
  console.error("usage: node bench_tiktoken.mjs TEXT_FILE [--repeat N] [--ids OUT]");
  process.exit(2);
}
const option = (name, fallback) => {
  const i = args.indexOf(name);
  return i < 0 ? fallback : args[i + 1];
};
const repeat = Number(option("--repeat", "3"));
const bytes = readFileSync(file);
const text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
const enc = get_encoding("gpt2");
let ids;
for (let r = 0; r < repeat; ++r) {
  const start = process.hrtime.bigint();
  const cpuStart = process.cpuUsage();
  ids = enc.encode_ordinary(text);
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  const cpu = process.cpuUsage(cpuStart);
  const cpuSeconds = (cpu.user + cpu.system) / 1e6;
  console.log(`tiktoken gpt2: ${bytes.length} bytes -> ${ids.length} tokens in ${seconds.toFixed(3)} s ` +
              `(${cpuSeconds.toFixed(3)} s CPU): ${(bytes.length / seconds / 1e6).toFixed(2)} MB/s, ` +
              `${(bytes.length / cpuSeconds / 1e6).toFixed(2)} MB/s of CPU time`);
}
const out = option("--ids", null);
if (out) writeFileSync(out, Array.from(ids).join(" ") + "\n");
enc.free();
