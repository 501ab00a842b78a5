"""The text pipeline around Qwen3.5's byte-level BPE, in one place for every script
that builds a tokenizer: NFC normaliser, the split regex (isolated), byte-level
pre-tokenizer and decoder, and optionally the byte-level post-processor."""

from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors


def set_qwen_pipeline(tok: Tokenizer, pattern: str, post_processor: bool = True) -> Tokenizer:
    """Sets Qwen3.5's normaliser, pre-tokenizer (split on `pattern`), decoder and,
    unless `post_processor` is false, post-processor on `tok`; returns it."""
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    if post_processor:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok
