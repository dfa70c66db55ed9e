"""A byte-level BPE tokenizer trained locally (the ``tokenizers`` package), so no run ever
downloads one. Digits are split one per token (as Llama's tokenizers do), which keeps
arithmetic learnable by small models. Saved as run_dir/tokenizer.json; a later run that
starts from this run's checkpoint (continued-pretrain, sft, rl) loads the same file. A run
from a Hugging Face model directory uses that model's tokenizer.json instead (its special
ids are kept in model.json, see node/train/hf.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"
SPECIALS = [PAD, BOS, EOS]  # ids 0, 1, 2
TOKENIZER_FILE = "tokenizer.json"


class Tok:
    """The few things the runtime needs from a tokenizer."""

    def __init__(self, tok: Tokenizer, ids: dict[str, int] | None = None):
        """``ids``: bos/eos/pad of a tokenizer that is not mtc's own (a Hugging Face
        model's); without them the <|pad|>/<|bos|>/<|eos|> tokens are looked up."""
        self.tok = tok
        if ids:
            self.pad_id, self.bos_id, self.eos_id = ids["pad"], ids["bos"], ids["eos"]
        else:
            self.pad_id = tok.token_to_id(PAD)
            self.bos_id = tok.token_to_id(BOS)
            self.eos_id = tok.token_to_id(EOS)
        if None in (self.pad_id, self.bos_id, self.eos_id):
            raise ValueError("tokenizer lacks the <|pad|>/<|bos|>/<|eos|> special tokens")

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def fingerprint(self) -> str:
        return hashlib.sha256(self.tok.to_str().encode()).hexdigest()[:16]

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.tok.to_str(), encoding="utf-8")
        tmp.replace(path)


def tokenizer_train(texts: Iterable[str], vocab_size: int) -> Tok:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte stays encodable
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return Tok(tok)


def tokenizer_load(path: Path, ids: dict[str, int] | None = None) -> Tok:
    return Tok(Tokenizer.from_file(str(path)), ids)
