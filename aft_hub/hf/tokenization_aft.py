"""The byte-level tokenizer of the AFT language models, as a plain transformers fast tokenizer.

Token id b (0 <= b < 256) is the byte b itself, so text round-trips byte for byte (any UTF-8 text, including
whitespace runs, control characters and emoji) and raw byte corpora such as enwik8 map to ids directly. Two special
tokens follow: ``<|endoftext|>`` (256; beginning and end of a document) and ``<pad>`` (257).

The tokenizer is a :class:`transformers.PreTrainedTokenizerFast` over a ``tokenizers`` byte-level model (the GPT-2
byte-to-character map, a BPE model without merges whose vocabulary is the 256 byte characters), so saving it next
to a model lets ``AutoTokenizer.from_pretrained(path)`` and ``pipeline("text-generation", model=path)`` load it with
transformers alone: no code of this package is needed to read it.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

from .configuration_aft import BOS_EOS_TOKEN_ID, BYTE_VOCAB_SIZE, PAD_TOKEN_ID

__all__ = ["build_byte_tokenizer", "EOS_TOKEN", "PAD_TOKEN"]

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<pad>"


def build_byte_tokenizer(model_max_length: int | None = None) -> PreTrainedTokenizerFast:
    """The byte-level tokenizer matching :class:`~aft_hub.hf.AftConfig`'s default vocabulary (258 ids).

    Args:
        model_max_length: the longest input the model accepts (``max_position_embeddings`` for AFT-local and
            AFT-full); None for no limit.

    Returns:
        A ``PreTrainedTokenizerFast``; ``save_pretrained`` writes ``tokenizer.json`` and ``tokenizer_config.json``.
    """
    byte_to_char = bytes_to_unicode()
    vocab = {byte_to_char[b]: b for b in range(256)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], ignore_merges=True))
    # no regex split and no prefix space: the whole text becomes its bytes, one token each
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    kwargs = {} if model_max_length is None else {"model_max_length": model_max_length}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        clean_up_tokenization_spaces=False,
        **kwargs,
    )
    assert tokenizer.convert_tokens_to_ids([EOS_TOKEN, PAD_TOKEN]) == [BOS_EOS_TOKEN_ID, PAD_TOKEN_ID]
    assert len(tokenizer) == BYTE_VOCAB_SIZE
    return tokenizer
