"""A tokenizer whose tokens are exactly the fake server's output tokens.

The fake server writes output token k as the text `" t<id>"` (id < 4096). A peer
that counts output tokens by re-tokenizing text would, with a real tokenizer (the
demo model's byte-level BPE splits " t1234" into 2-5 pieces), count several times
too many tokens and report a rate several times too high. With this word-level
vocabulary (`t0` .. `t4095`, split on whitespace) any re-tokenizing tool counts
exactly what the server sent, so a peer's error is its timing, not its counting.
Prompts tokenize mostly to `<unk>`: only the input-length statistics see that.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers

from tokrecord.server.fake import VOCAB_SIZE

UNK = "<unk>"
EOS = "<|endoftext|>"
VERSION = 1


def build_tokenizer() -> Tokenizer:
    vocab = {f"t{i}": i for i in range(VOCAB_SIZE)}
    vocab[UNK] = VOCAB_SIZE
    vocab[EOS] = VOCAB_SIZE + 1
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def ensure_tokenizer_dir(directory: Path) -> Path:
    """Write the tokenizer as a Hugging Face tokenizer directory (once)."""
    stamp = directory / ".complete"
    if stamp.is_file() and stamp.read_text() == str(VERSION):
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    build_tokenizer().save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": UNK,
        "eos_token": EOS,
        "bos_token": EOS,
        "pad_token": EOS,
        "model_max_length": 1_000_000,
        "clean_up_tokenization_spaces": False,
        # Only so tools that insist on a template can render one; the bench sends raw text.
        "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    (directory / "special_tokens_map.json").write_text(
        json.dumps({"unk_token": UNK, "eos_token": EOS, "bos_token": EOS, "pad_token": EOS}) + "\n"
    )
    stamp.write_text(str(VERSION))
    return directory
