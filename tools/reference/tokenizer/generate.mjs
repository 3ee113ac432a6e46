// Writes tests/data/tokenizer/tiktoken_gpt2.json: texts and the ids that OpenAI's
// tiktoken (npm `tiktoken`, the WASM build of the Rust original; `gpt2` encoding,
// encode_ordinary) gives them. ldlm's tokenizer tests compare against it without node.
// Also the expected outputs of the CLI tests in tests/cli/data: the ids of
// tokenizer_sample.txt and the bytes of ids that end inside a character.
//   cd tools/reference/tokenizer && npm ci && node generate.mjs
// Deterministic: fixed seeds, no timestamps; rerunning gives the same file.
import { writeFileSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { get_encoding } from "tiktoken";

const here = fileURLToPath(new URL(".", import.meta.url));
const tests = `${here}../../../tests`;
const out = `${tests}/data/tokenizer/tiktoken_gpt2.json`;
const tiktokenVersion = JSON.parse(readFileSync(`${here}node_modules/tiktoken/package.json`, "utf8")).version;

// mulberry32: a small seeded generator, so the random cases never change.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const cp = (...codes) => String.fromCodePoint(...codes);
const cases = [];
const add = (name, text) => cases.push({ name, text });

add("empty", "");
add("english", "Hello world! The quick brown fox jumps over the lazy dog. GPT-2 was released in 2019.");
add("contractions lower", "it's I'm we'll they've you're he'd don't can't 'tis rock'n'roll");
add("contractions upper", "IT'S I'M WE'LL THEY'VE YOU'RE HE'D DON'T CAN'T");
add("contractions mixed", "It'S We'Ll They'Ve You'rE 'S'LL'Re'RE'VE'Ve'D'M'T's'll're've'd'm't");
add("apostrophe before capitals", "O'Reilly D'Arcy 'Sam 'Tis 'Dave 'Mike 'LLama 'REally 'VEry 'Don O'Malley");
add("contractions alone", "'s 's'd ''s '''ll ' s 'x 'sup");
add("curly apostrophe", "it\u2019s we\u2019ll \u2018quoted\u2019");
add("digits", "0 1 12 123 1234 12345 123456 1234567890 3.14159 1,000,000 2024-05-13 x2y3 v1.2.3");
add("other numbers", "\uff10\uff11\uff12 \u0663\u0664\u0665 \u00b2\u00b3\u00b9 \u00bd\u00bc \u216b \u2460\u2461 \u0e51\u0e52");
add("whitespace runs", "a b  c   d    e     f\t\tg \t h\t \ti  \n  j\n\n\nk");
add("leading and trailing spaces", "   leading and trailing   ");
add("only spaces", "     ");
add("newlines", "line one\nline two\n\nline four\n");
add("crlf", "line one\r\nline two\r\n\r\nline four\r\n");
add("carriage returns", "a\rb\r\rc \r d");
add("tabs", "\tindented\n\t\tdouble\n    spaces\n\t mixed");
add("nbsp", "a\u00a0b \u00a0c\u00a0 d\u00a0\u00a0e 100\u00a0km");
add("form feed vertical tab", "page\fbreak\vtab \f \v");
add("special token strings", "<|endoftext|> hello<|endoftext|>world <|pad|><|mask|>");
add("cjk", "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u3053\u3093\u306b\u3061\u306f\u4e16\u754c\u3001\u30ab\u30bf\u30ab\u30ca \uc548\ub155\ud558\uc138\uc694 \uc138\uacc4");
add("greek", "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5! \u03b1\u03b2\u03b3");
add("cyrillic", "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u042d\u0442\u043e \u0442\u0435\u0441\u0442.");
add("arabic and hebrew", "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd");
add("indic and thai", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35");
add("emoji", "\ud83d\udc4d \ud83d\udc4d\ud83c\udffd \ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67\u200d\ud83d\udc66 \u2764\ufe0f a\ud83d\ude00b  \ud83d\ude00\ud83d\ude00");
add("emoji skin tones", "\ud83d\udc4b\ud83c\udffb\ud83d\udc4b\ud83c\udffc\ud83d\udc4b\ud83c\udffd\ud83d\udc4b\ud83c\udffe\ud83d\udc4b\ud83c\udfff \ud83e\uddd1\ud83c\udffd\u200d\ud83d\udcbb");
add("flags", "\ud83c\uddeb\ud83c\uddf7\ud83c\udde9\ud83c\uddea\ud83c\uddef\ud83c\uddf5 \ud83c\udff3\ufe0f\u200d\ud83c\udf08 \ud83c\udff4\udb40\udc67\udb40\udc62\udb40\udc65\udb40\udc6e\udb40\udc67\udb40\udc7f");
add("combining marks", "e\u0301 n\u0303 a\u0300\u0301\u0302\u0303 Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034da\u0300\u0301 \u0915\u093f");
add("control characters", "\u0000a\u0000b \u0001\u0002\u0003\u0004 \u007f\u0080\u0081\u009f \u001b[31mred\u001b[0m");
add("noncharacters and private use", "\ufffe\uffff \ue000\uf8ff \udbff\udfff \u{10fffd} \ufffd");
add("unicode 15 and later letters", "a\u{31350}a 1\u{1d2c0}1 \u{11f04}\u{11f05} \u{1e030}x \u{2ebf0} \u{10ec2}");
add("mixed scripts", "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber Stra\u00dfe \u0130stanbul \u00e6\u00f8\u00e5 \u0141\u00f3d\u017a");
add("code", "int main(void) {\n    printf(\"%d\\n\", x[i] += 0x1F);\n    return a->b != c && d <= e;\n}\n");
add("urls and punctuation", "https://example.com/path?q=1&r=2#frag -- (parens) [brackets] {braces} ... !!! ??? \"quotes\"");

// Every character that Unicode, Rust's regex or JavaScript may treat as white space,
// and the zero-width characters next to them, in many surroundings.
const spaces = [0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x20, 0x85, 0xa0, 0x1680, 0x180e, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004,
  0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a, 0x200b, 0x200c, 0x200d, 0x2028, 0x2029, 0x202f, 0x205f, 0x2060,
  0x3000, 0xfeff];
for (const code of spaces) {
  const x = cp(code);
  const hex = code.toString(16).toUpperCase().padStart(4, "0");
  add(`space U+${hex}`, [`a${x}b`, `a${x}${x}b`, `a ${x}b`, `a${x} b`, `${x}a`, `a${x}`, x, `${x}${x}${x}`, `\n\n${x}`,
    `${x}\n\n`, `${x} a`, `a  ${x}b`, `1${x}2`, `!${x}?`, `a ${x} b`, `a  ${x}${x}  b`, `'s${x}`, `\t${x}\t`, `\r\n${x}\r\n`,
    `${x}\u00a0${x}`].join("|"));
}

const words = ["the", "of", "and", "licence", "Software", "copyright", "\u00e9t\u00e9", "\u043c\u0438\u0440",
  "\u4e16\u754c", "42", "3.14", "don't", "WE'LL", "\ud83d\ude00", "--", "\n", "\n\n", "  ", "\t", "\u00a0", "\u3000",
  "\u0085", "\ufeff", "(see", "\"quoted\"", "http://x.org", "e\u0301", "\r\n"];
{
  const r = rng(1);
  let text = "";
  while (text.length < 60000) {
    text += words[Math.floor(r() * words.length)];
    text += r() < 0.8 ? " " : r() < 0.5 ? "" : "\n";
  }
  add("long mixed text", text);
}
add("long word letters", "a".repeat(6000));
add("long word repeated", "supercalifragilisticexpialidocious".repeat(150));
add("long word alternating", "ab".repeat(3000));
add("long digits", "1234567890".repeat(600));
add("long punctuation", "!".repeat(3000) + "?!".repeat(1000) + "=".repeat(3000));
add("long accented", "\u00e9".repeat(3000));
add("long emoji", "\ud83d\ude00".repeat(1500));
add("long spaces then word", " ".repeat(5000) + "word");
add("long newlines", "\n".repeat(3000) + "x" + "\r\n".repeat(2000));
add("long nbsp", "\u00a0".repeat(3000) + "x");

// Random strings over all of Unicode (surrogates excluded), weighted towards ASCII,
// Latin-1 and the BMP, so every character class meets every other.
{
  const r = rng(2);
  for (let i = 0; i < 1500; ++i) {
    let text = "";
    const length = 1 + Math.floor(r() * 16);
    for (let k = 0; k < length; ++k) {
      const u = r();
      let code = u < 0.3 ? 0x20 + Math.floor(r() * 0x5f) : u < 0.4 ? Math.floor(r() * 0x100)
        : u < 0.5 ? spaces[Math.floor(r() * spaces.length)] : u < 0.8 ? Math.floor(r() * 0x10000)
        : Math.floor(r() * 0x110000);
      if (code >= 0xd800 && code < 0xe000) code = 0x41 + (code & 15);
      text += cp(code);
    }
    add(`random ${i}`, text);
  }
}

const enc = get_encoding("gpt2");
const sample = readFileSync(`${tests}/cli/data/tokenizer_sample.txt`, "utf8");
writeFileSync(`${tests}/cli/data/tokenizer_sample.ids`, Array.from(enc.encode_ordinary(sample)).join(" ") + "\n");
writeFileSync(`${tests}/cli/data/detokenize_cut.bin`, enc.decode(new Uint32Array([40, 2067, 12520, 247])));
const data = {
  source: "tools/reference/tokenizer/generate.mjs",
  reference: `npm tiktoken ${tiktokenVersion}, get_encoding("gpt2").encode_ordinary`,
  cases: cases.map(({ name, text }) => ({ name, text, ids: Array.from(enc.encode_ordinary(text)) })),
};
enc.free();
// One case per line keeps diffs of the file readable.
const body = data.cases.map((c) => "    " + JSON.stringify(c)).join(",\n");
writeFileSync(out, `{\n  "source": ${JSON.stringify(data.source)},\n  "reference": ${JSON.stringify(data.reference)},\n` +
  `  "cases": [\n${body}\n  ]\n}\n`);
const ids = data.cases.reduce((n, c) => n + c.ids.length, 0);
console.log(`wrote tests/data/tokenizer/tiktoken_gpt2.json (${data.cases.length} cases, ${ids} ids) and tests/cli/data`);
