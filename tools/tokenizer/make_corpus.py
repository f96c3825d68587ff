#!/usr/bin/env python3
# Writes tests/fixtures/tokenizer/corpus.jsonl: >= 1000 deterministic lines ({"text": ...}) that
# exercise the byte-level BPE tokenizers: many scripts, code, emoji/ZWJ, NFD input, whitespace runs,
# numbers, URLs and inline special tokens. No randomness from the platform: a fixed LCG picks mixes.
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "..", "tests", "fixtures", "tokenizer", "corpus.jsonl")

# Sentences written by hand, one script or topic each.
LANGUAGES = [
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say it's fine, but we'd rather not; you've been warned, they're late.",
    "DON'T SHOUT! I'M LISTENING. WE'LL SEE. IT'S OK. YOU'VE GOT IT. THEY'RE HERE. HE'D GO.",
    "Reinforcement learning from human feedback (RLHF) fine-tunes a policy with PPO.",
    "Grüße aus München! Die Straße ist schön, über Äpfel und Öl.",
    "Le cœur a ses raisons que la raison ne connaît point. Où est l'hôtel ?",
    "¿Dónde está la biblioteca? ¡Qué día tan bonito! El niño comió piña.",
    "Ação, coração e pão: não há razão para isso.",
    "Zażółć gęślą jaźń. Łódź jest w Polsce.",
    "Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "Árvíztűrő tükörfúrógép.",
    "Pijamalı hasta yağız şoföre çabucak güvendi. İstanbul, ıspanak.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Привіт, як справи? Ґанок і їжак.",
    "Τάχιστη αλώπηξ βαφής ψημένη γη, δρασκελίζει υπέρ νωθρού κυνός.",
    "中文分词是自然语言处理的基础任务。我们今天去北京大学。",
    "強化学習は大規模言語モデルの事後学習に使われます。ひらがなとカタカナ、漢字。",
    "안녕하세요, 세계! 한국어 문장을 토큰화합니다.",
    "مرحبا بالعالم! هذه جملة باللغة العربية مع أرقام ١٢٣٤٥٦.",
    "שלום עולם! זה משפט בעברית.",
    "नमस्ते दुनिया! यह हिंदी में एक वाक्य है। क्षत्रिय और ज्ञान।",
    "বাংলা ভাষায় একটি বাক্য।",
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ สวัสดีครับ",
    "Tiếng Việt có nhiều dấu: người, được, những, trường học.",
    "ქართული ენა ლამაზია.",
    "Հայերեն լեզու։",
    "தமிழ் ஒரு பழமையான மொழி.",
    "తెలుగు భాష.",
    "ಕನ್ನಡ ಭಾಷೆ.",
    "മലയാളം ഭാഷ.",
    "ગુજરાતી ભાષા.",
    "ਪੰਜਾਬੀ ਭਾਸ਼ਾ.",
    "සිංහල භාෂාව.",
    "ພາສາລາວ.",
    "ភាសាខ្មែរ។",
    "မြန်မာဘာသာ။",
    "አማርኛ ቋንቋ።",
    "ᚠᚢᚦᚨᚱᚲ runes and 𐌰𐌱𐌲 Gothic, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math letters 𝐀𝐁𝐂.",
    "Ελληνικά και English mixed with русский and 中文 in one line.",
    "Fullwidth: ＡＢＣ１２３！？ and halfwidth ｶﾀｶﾅ.",
    "Ligatures ﬁ ﬂ and compatibility ㎏ ℃ Ⅻ ½ ² are not changed by NFC.",
    "Łukasz, Ørsted, Þór, Ðakovo, Æsir, Œuvre, ßharp.",
]

CODE = [
    "def forward(self, x: torch.Tensor) -> torch.Tensor:",
    "    return self.proj(torch.nn.functional.silu(self.gate(x)) * self.up(x))",
    "for (int i = 0; i < n; ++i) { acc += a[i] * b[i]; }",
    "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\treturn 0;\n}",
    "const f = async (x) => { await fetch(`https://api.example.com/v1/${x}`); };",
    "{\"role\": \"user\", \"content\": \"Hello\", \"ids\": [1, 2, 3], \"ok\": true, \"none\": null}",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name ORDER BY 2 DESC;",
    "if [[ -z \"$HOME\" ]]; then echo 'no home' >&2; exit 1; fi",
    "x = [i**2 for i in range(10) if i % 2 == 0]  # squares of evens",
    "fn main() { let v: Vec<u32> = (0..10).map(|x| x * x).collect(); println!(\"{:?}\", v); }",
    "<div class=\"container\"><p id='p1'>Hello &amp; welcome</p></div>",
    "matrix = np.zeros((3, 3), dtype=np.float32); matrix[1, :] += 0.5",
    "    \t  mixed    indentation\t\twith tabs  ",
    "a+=1;b-=2;c*=3;d/=4;e%=5;f<<=6;g>>=7;h&=8;i|=9;j^=10;",
    "$$\\int_0^1 x^2\\,dx = \\frac{1}{3}$$ and \\(\\alpha + \\beta \\leq \\gamma\\)",
    "The answer is \\boxed{42}. #### 42",
    "git commit -m \"fix: handle ZWJ sequences\" && git push origin main",
    "print(f\"{name!r:>10} {value:08.3f}\")",
    "    if x is None:\n        raise ValueError(\"x must not be None\")\n",
    "key: value\nlist:\n  - one\n  - two\n",
]

EMOJI = [
    "I love it 😀😃😄 so much!",
    "Family: 👨‍👩‍👧‍👦 and couple 👩‍❤️‍👨, technologist 👩🏽‍💻.",
    "Flags: 🇺🇸🇫🇷🇯🇵🇨🇳 and 🏴‍☠️ pirate, 🏳️‍🌈 rainbow.",
    "Skin tones: 👋🏻👋🏼👋🏽👋🏾👋🏿 waving.",
    "Keycaps 1️⃣ 2️⃣ #️⃣ and variation selectors ☺︎ ☺️.",
    "🤖🚀🔥💯✨🎉 emoji only line",
    "Mixed 文字と絵文字🍣🍜 in Japanese.",
    "Heart ❤️ vs ♥ vs 💔 vs 🫶",
]

# Combining sequences written with escapes so the file is independent of the editor's normalization.
NFD = [
    "Cafe\u0301 na\u0131\u0308ve re\u0301sume\u0301 (NFD input, NFC folds these).",
    "A\u030a ångström vs A\u030angstro\u0308m",
    "e\u0301e\u0300e\u0302e\u0308 o\u0303 n\u0303 c\u0327",
    "Vie\u0323\u0302t Nam, ti\u00ea\u0301ng Vi\u00ea\u0323t",
    "\u1100\u1161\u11a8 Hangul jamo compose to \uac01",
    "q\u0307\u0323 stacked marks, x\u0360y double, Z\u0335\u0321a\u0337l\u0336g\u0334o\u0338",
    "\u212b angstrom sign and \u2126 ohm sign are NFC-mapped singletons",
    "\u0915\u093c \u0921\u093c Devanagari nukta compositions",
]

WHITESPACE = [
    "two  spaces   three    four     five",
    "\ttab at start and\tin middle\t",
    "line one\nline two\n\nline four after blank",
    "windows\r\nline\r\nendings\r\n",
    "trailing spaces     ",
    "     leading spaces",
    "\n\n\nleading newlines",
    "mixed \t \n \t whitespace \n\n  \t",
    "non-breaking\u00a0space and\u2003em space and\u3000ideographic space",
    "   ",
    "\n",
    "a\n b\n  c\n   d",
    " \n \n",
    "word\u2028line separator\u2029paragraph separator",
]

NUMBERS = [
    "1234567890",
    "3.14159265358979323846264338327950288",
    "The year 2024 had 366 days; 1,000,000 people; -42; +7; 1e-9; 0x1F; 0b1010.",
    "Phone: +1 (555) 123-4567, ZIP 90210, ISBN 978-3-16-148410-0",
    "Arabic-Indic ٠١٢٣٤٥٦٧٨٩ and Devanagari १२३ and fullwidth ０１２ digits",
    "Roman Ⅳ and superscript x² and fractions ¾ ⅓",
    "12:30:45 2024-01-31T23:59:59Z 99.9% $19.99 €5 ¥100 £3",
    "v1.2.3-beta+build.45",
]

URLS = [
    "Visit https://huggingface.co/Qwen/Qwen3-8B/blob/main/tokenizer.json?download=true#L12",
    "mailto:someone@example.com and ftp://files.example.org/pub/a_b-c.tar.gz",
    "http://例え.jp/パス?クエリ=値 and https://xn--r8jz45g.jp",
    "www.example.com/path/to/page.html?a=1&b=2&c=%20space",
]

SPECIAL = [
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>",
    "text before<|endoftext|>text after",
    "<think>\nLet me reason step by step.\n</think>\n\nThe answer is 4.",
    "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"verl\"}}\n</tool_call>",
    "half tokens <|im_start and im_end|> and <|eot_id| are plain text",
    "  <|im_start|>  spaces around special  <|im_end|>  ",
    "<|eot_id|><|eot_id|>back to back<|im_end|><|im_end|>",
    "<|end_of_text|> llama end and <|finetune_right_pad_id|> pad",
    "<|reserved_special_token_5|> reserved and <|python_tag|> tag",
    "<|vision_start|><|image_pad|><|vision_end|> qwen vision tokens",
    "<tool_response>\nresult\n</tool_response>",
]

CONTRACTIONS = [
    "'s 't 're 've 'm 'll 'd",
    "'S 'T 'RE 'VE 'M 'LL 'D",
    "it's John's and James' and the '90s",
    "rock 'n' roll, ma'am, o'clock, y'all'd've",
    "quote: 'single' \"double\" `back` «guillemets» „low“ ‘curly’ “curly”",
]

# Fragments that mixed lines are assembled from.
FRAGMENTS = [
    "hello", "world", "Hello", " World", "tokenizer", "BPE", "ids", "merge", "的", "是", "日本",
    "привет", "мир", "مرحبا", "नमस्ते", "สวัสดี", "한국", "😀", "👩‍💻", "🇯🇵", "e\u0301", "n\u0303",
    "123", "4567", "3.14", "٣", "  ", "\t", "\n", "\r\n", "...", "!!", "??", "--", "==", "->", "::",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|begin_of_text|>", "<think>",
    "</think>", "https://example.com/a?b=c", "user@example.org", "don't", "WE'LL", "x**2", "{}", "[]",
    "()", "#", "@", "$", "%", "^", "&", "*", "_", "~", "|", "\\", "/", "'", "\"", "`", ";", ":",
    "Straße", "naïve", "über", "Ωmega", "λ", "∑", "√2", "∞", "≤", "≠", "→", "⇒", "♪", "©", "™",
    "\u00a0", "\u3000", "ﬁ", "Ⅻ", "𝔘", "𐍈", "ℕ", "ǅ", "İ", "ı", "ǰ", "ΐ",
]


class Lcg:
    """64-bit LCG (Knuth MMIX constants): the same sequence on every machine and Python version."""

    def __init__(self, seed):
        self.state = seed & 0xFFFFFFFFFFFFFFFF

    def next(self, n):
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        return (self.state >> 33) % n


def main():
    lines = []
    for group in (LANGUAGES, CODE, EMOJI, NFD, WHITESPACE, NUMBERS, URLS, SPECIAL, CONTRACTIONS):
        lines.extend(group)
    # Pairs of hand-written lines joined by different separators.
    hand = LANGUAGES + CODE + EMOJI + NFD + NUMBERS + URLS + SPECIAL + CONTRACTIONS
    seps = [" ", "\n", "  ", "\t", "", " \n ", "\n\n"]
    rng = Lcg(20240531)
    while len(lines) < 700:
        a = hand[rng.next(len(hand))]
        b = hand[rng.next(len(hand))]
        lines.append(a + seps[rng.next(len(seps))] + b)
    # Random mixes of fragments: stress the boundaries between regex classes.
    while len(lines) < 1100:
        k = 1 + rng.next(12)
        lines.append("".join(FRAGMENTS[rng.next(len(FRAGMENTS))] for _ in range(k)))
    # Long lines (a paragraph each) so throughput is not dominated by per-line overhead.
    for i in range(40):
        parts = [hand[rng.next(len(hand))] for _ in range(20)]
        lines.append(" ".join(parts))
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8", newline="\n") as f:
        for text in lines:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    print(f"wrote {len(lines)} lines to {os.path.relpath(OUT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
