#!/usr/bin/env python3
"""Generate the tokenizer test fixtures with Hugging Face `tokenizers`.

Writes into appliance/tokenizer/tests/data/:
- corpus.json: the test texts (hand-picked cases + seeded random strings);
- small_tokenizer.json: a small byte-level BPE trained here with Qwen3.5's
  normalizer and pre-tokenizer (plus added tokens, one of them `normalized`);
- small_ignore_merges_tokenizer.json: the same with `ignore_merges: true`;
- expected_small.json, expected_small_ignore_merges.json, expected_qwen35.json:
  `encode(text).ids` of every corpus text, by Hugging Face `tokenizers`;
- chat_qwen35.json: chat conversations, their rendering by the Qwen3.5 template
  and the ids Hugging Face `tokenizers` gives that text.

Usage: gen_fixtures.py QWEN35_TOKENIZER_JSON
(make it with scripts/tokenizer/make_qwen_tokenizer.sh first)
"""

import json
import random
import sys
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qwen_pipeline import set_qwen_pipeline  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "appliance/tokenizer/tests/data"
PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

QWEN_ADDED = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
]

HAND = [
    "",
    "Hello world",
    "The quick brown fox jumps over the lazy dog. It's 5 o'clock; we'll see.",
    "I'M SURE YOU'RE RIGHT, WE'VE DONE IT, HE'S HERE, THEY'LL COME, I'D GO, DON'T.",
    "Mixed case: 'S 'T 'Re 'vE 'M 'Ll 'D and the long s: 'ſ and 'ſt.",
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "fn main() {\n\tlet v: Vec<u32> = (0..10).map(|x| x * x).collect();\n\tprintln!(\"{v:?}\");\n}\n",
    "<div class=\"a\">&nbsp;<a href='/x?y=1&z=2'>link</a></div>",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "中文测试：今天天气很好，我们去公园散步吧。",
    "日本語のテキスト、カタカナとひらがな。한국어 텍스트도 있습니다.",
    "Emoji: 😀😃😄 👍🏽 ❤️ 🇫🇷🇯🇵 family 👨‍👩‍👧‍👦 and 🏳️‍🌈 and 🧑🏿‍💻",
    "Combining: e\u0301 a\u0300 o\u0308 n\u0303 A\u030a \u1e0b\u0323 q\u0307\u0323 Z\u0335\u0321\u0328\u0327",
    "Decomposed café vs composed café; Å Ω K (Kelvin, Angstrom, Ohm signs)",
    "Devanagari: नमस्ते दुनिया, Thai: สวัสดีชาวโลก, Arabic: مرحبا بالعالم, Hebrew: שָׁלוֹם",
    "tabs\tand\t\ttabs\t",
    "trailing spaces   ",
    "   leading spaces",
    "many\n\n\n\n\n\nnewlines\n\n",
    "CRLF line\r\nnext line\r\n\r\nlast\r",
    "NBSP\u00a0here\u00a0\u00a0and ideographic\u3000space, thin\u2009space, line\u2028sep, nel\u0085",
    "zero\u200bwidth\u200djoiner\u200cnon-joiner\ufeffbom",
    "Numbers: 0 12 345 6789 3.14159 -2.5e10 1,000,000 ٣٤٥ ⅫⅣ ½ ²³",
    "Punctuation!!! ??? ... --- *** ### @@@ $$$ %%% ^^^ &&& (((( )))) [[[ ]]] {{{ }}}",
    "a" * 300,
    " " * 100 + "x",
    "=" * 120 + "\n" + "-" * 80,
    "ab" * 100,
    "\n",
    " ",
    "\t\n \r\n",
    "x  \n  y",
    "Special tokens inline: " + " ".join(QWEN_ADDED),
    "".join(QWEN_ADDED),
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>",
    "Near misses: <|im_start| <im_end|> <|IM_END|> <think > </ think> <|endoftext|>>",
    "Control chars: \x00\x01\x07\x1b[31mred\x1b[0m \x7f",
    "Private use \ue000 and supplementary 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙𝟚 and CJK ext 𠀀𪚥",
    "URL https://example.com/path?query=1&b=%20#frag and email a.b@c.de",
    "the word the: the then the",
]

POOL = (
    list("abcXYZ019 '\t\n\r.,;:!?-_()[]{}<>|/\\\"#$%&*+=~`^@")
    + ["'s", "'S", "'re", "'LL", "'ſ", "<|im_end|>", "<think>", "</think>", "<|endoftext|>"]
    + list("\u00a0\u3000\u2009\u2028\u0085\u200b\u200d\ufeff")
    + list("éÅ\u0301\u0308\u0323\u0300中文字日本語한국ñßΩωЖж٣½²Ⅻअनस्")
    + ["👍", "🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "😀", "\U0001f9d1\u200d\U0001f4bb", "𝔘", "\x00", "\x7f"]
)


def corpus() -> list[str]:
    rng = random.Random(20261202)
    out = list(HAND)
    for _ in range(400):
        n = rng.randint(1, 40)
        out.append("".join(rng.choice(POOL) for _ in range(n)))
    return out


def train_small(texts: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    set_qwen_pipeline(tok, PATTERN)
    trainer = trainers.BpeTrainer(
        vocab_size=1200,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[AddedToken(t, normalized=False, special=True) for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]],
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, normalized=False) for t in ["<think>", "</think>", "<tool_response>", "</tool_response>"]])
    tok.add_tokens([AddedToken("café", normalized=True)])
    return tok


def training_text() -> list[str]:
    import textwrap, json as js, argparse  # noqa: E401  stdlib sources: English prose + code
    text = []
    for mod in (textwrap, js, argparse):
        text.extend(Path(mod.__file__).read_text().splitlines(keepends=True))
    return text + HAND


def encode_all(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    return [tok.encode(t).ids for t in texts]


def py_strip(s: str) -> str:
    return s.strip()


def render_chat(messages: list[dict], add_generation_prompt: bool, thinking: bool) -> str:
    """The Qwen3.5 chat layout (no tools), written from the template's documented behaviour."""
    out = []
    last_query = max(i for i, m in enumerate(messages) if m["role"] == "user"
                     and not (m["content"].strip().startswith("<tool_response>") and m["content"].strip().endswith("</tool_response>")))
    for i, m in enumerate(messages):
        content = py_strip(m["content"])
        if m["role"] in ("system", "user"):
            out.append(f"<|im_start|>{m['role']}\n{content}<|im_end|>\n")
        elif m["role"] == "assistant":
            reasoning = m.get("reasoning")
            if reasoning is None:
                reasoning = ""
                if "</think>" in content:
                    reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
                    content = content.split("</think>")[-1].lstrip("\n")
            reasoning = reasoning.strip()
            if i > last_query:
                out.append(f"<|im_start|>assistant\n<think>\n{reasoning}\n</think>\n\n{content}")
            else:
                out.append(f"<|im_start|>assistant\n{content}")
            out.append("<|im_end|>\n")
        elif m["role"] == "tool":
            if i == 0 or messages[i - 1]["role"] != "tool":
                out.append("<|im_start|>user")
            out.append(f"\n<tool_response>\n{content}\n</tool_response>")
            if i == len(messages) - 1 or messages[i + 1]["role"] != "tool":
                out.append("<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n" + ("<think>\n" if thinking else "<think>\n\n</think>\n\n"))
    return "".join(out)


CHATS = [
    {"messages": [{"role": "user", "content": "Hello!"}], "thinking": True},
    {"messages": [{"role": "user", "content": "Hello!"}], "thinking": False},
    {"messages": [{"role": "system", "content": "  You are a terse assistant.\n"},
                  {"role": "user", "content": "Why is the sky blue? 空はなぜ青い？"}], "thinking": True},
    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "<think>\nSimple sum.\n</think>\n\n4"},
                  {"role": "user", "content": "And 3+3?"}], "thinking": False},
    {"messages": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "Let me check.", "reasoning": "Need the tool."},
                  {"role": "tool", "content": "{\"temp\": 21}"},
                  {"role": "tool", "content": "{\"sky\": \"clear\"}"}], "thinking": True},
    {"messages": [{"role": "user", "content": "code:\n```py\nprint('hi')\n```\n\n\n"},
                  {"role": "assistant", "content": "Done.\r\n"},
                  {"role": "user", "content": "  more 👍🏽  "}], "thinking": True},
]


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    qwen = Tokenizer.from_file(sys.argv[1])
    DATA.mkdir(parents=True, exist_ok=True)
    texts = corpus()
    (DATA / "corpus.json").write_text(json.dumps(texts, ensure_ascii=False, indent=0) + "\n")

    small = train_small(training_text())
    small.save(str(DATA / "small_tokenizer.json"))
    spec = json.loads((DATA / "small_tokenizer.json").read_text())
    spec["model"]["ignore_merges"] = True
    # Make " the" unreachable by merges: only whole-piece lookup (ignore_merges) finds it.
    spec["model"]["merges"] = [m for m in spec["model"]["merges"] if m != ["Ġt", "he"]]
    ignoring = Tokenizer.from_str(json.dumps(spec))
    ignoring.save(str(DATA / "small_ignore_merges_tokenizer.json"))

    def dump(name, ids):
        (DATA / name).write_text("[\n" + ",\n".join(json.dumps(x) for x in ids) + "\n]\n")

    dump("expected_small.json", encode_all(small, texts))
    dump("expected_small_ignore_merges.json", encode_all(ignoring, texts))
    dump("expected_qwen35.json", encode_all(qwen, texts))

    chats = []
    for case in CHATS:
        text = render_chat(case["messages"], True, case["thinking"])
        chats.append({**case, "text": text, "ids": qwen.encode(text).ids})
    (DATA / "chat_qwen35.json").write_text(json.dumps(chats, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote fixtures for {len(texts)} texts and {len(chats)} chats into {DATA}")


if __name__ == "__main__":
    main()
