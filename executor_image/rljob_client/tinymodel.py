"""Build the tiny random LLaMA model that tests and local mode serve with vLLM's CPU build.

There is no model hub on the machines this project runs its tests on, so the model is made
here: a 2-layer LLaMA with random weights drawn from a seed and a byte-level BPE tokenizer
trained on a built-in corpus. vLLM's CPU attention rejects head_dim 16, hence 2 heads of 32.
The build is deterministic from the seed and cached by content: a directory that already
holds a complete model from the same builder version and seed is left as it is.

    python -m rljob_client.tinymodel OUT_DIR [--seed N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BUILDER_VERSION = 1
MARKER = "rljob_tinymodel.json"
SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eos|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|bos|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|bos|>assistant: {% endif %}"
)
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class TinyModelConfig:
    """The shape of the tiny model; every field lands in the saved LlamaConfig."""

    vocab_size: int = 1000
    hidden_size: int = 64
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    head_dim: int = 32
    num_hidden_layers: int = 2
    intermediate_size: int = 128
    max_position_embeddings: int = 512
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"


DEFAULT_CONFIG = TinyModelConfig()


def builder_stamp(seed: int, config: TinyModelConfig = DEFAULT_CONFIG) -> dict[str, Any]:
    """What a cached build must match to be reused."""
    return {"builder_version": BUILDER_VERSION, "seed": seed, "config": asdict(config)}


def corpus_lines() -> list[str]:
    """A fixed, seed-independent corpus: the tokenizer must be the same for every seed.

    English sentences about the project plus pseudo-words built from syllables with a fixed
    generator, so that BPE finds enough merges to reach the target vocabulary.
    """
    base = [
        "The controller starts engines, watches their health and updates their weights.",
        "A rollout generates samples, scores them and sends batches to the trainers.",
        "Reinforcement learning improves a policy from rewards it collects over time.",
        "The quick brown fox jumps over the lazy dog while the engine serves requests.",
        "Numbers count: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 32 64 128 256 512 1024.",
        "Weights move from disk to the engine; the version moves with them.",
        "user: hello there! assistant: hello, how can I help you today?",
        "Question: what is two plus two? Answer: four. Question: and three plus five? Answer: eight.",
    ]
    rng = random.Random(20261129)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(1500)]
    lines = list(base) * 4
    for i in range(0, len(words), 12):
        lines.append(" ".join(words[i : i + 12]) + ".")
    return lines


def build_tokenizer(vocab_size: int) -> Any:
    """Train a byte-level BPE on the built-in corpus and wrap it for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    pad, bos, eos = SPECIAL_TOKENS
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad, model_max_length=512
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(seed: int, config: TinyModelConfig, token_ids: dict[str, int]) -> Any:
    """A LlamaForCausalLM with weights drawn from `seed` (CPU generator: same bits everywhere)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = asdict(config)
    legacy_rope: dict[str, Any] = {"rope_theta": 10000.0}
    dtype = getattr(torch, cfg.pop("torch_dtype"))
    llama = LlamaConfig(
        **cfg,
        pad_token_id=token_ids["pad"],
        bos_token_id=token_ids["bos"],
        eos_token_id=token_ids["eos"],
        rms_norm_eps=1e-5,
        # transformers 5 moved rope_theta into rope_parameters; the legacy keyword is still
        # converted, and keeping it keeps the built model's config.json byte-for-byte the same.
        **legacy_rope,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama)
    return model.to(dtype).eval()


def is_complete(out_dir: Path, seed: int, config: TinyModelConfig = DEFAULT_CONFIG) -> bool:
    """True when `out_dir` holds every file of a build with this builder version, seed and shape."""
    marker = out_dir / MARKER
    if not marker.is_file() or not all((out_dir / f).is_file() for f in REQUIRED_FILES):
        return False
    try:
        return json.loads(marker.read_text()) == builder_stamp(seed, config)
    except (OSError, ValueError):
        return False


def build_tiny_model(
    out_dir: str | os.PathLike[str], seed: int = 0, config: TinyModelConfig = DEFAULT_CONFIG
) -> Path:
    """Build (or reuse) the tiny model in `out_dir` and return its path.

    The build happens in a sibling temporary directory and is renamed into place, with the
    marker written last, so that a crash or a concurrent builder never leaves a half model
    that a later call would mistake for a complete one.
    """
    out = Path(out_dir).resolve()
    if is_complete(out, seed, config):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)  # readable by engine containers that run as another user
    try:
        tokenizer = build_tokenizer(config.vocab_size)
        ids = {
            "pad": tokenizer.pad_token_id,
            "bos": tokenizer.bos_token_id,
            "eos": tokenizer.eos_token_id,
        }
        model = build_model(seed, config, ids)
        model.generation_config.do_sample = False
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps(builder_stamp(seed, config)))
        if out.exists():
            if is_complete(out, seed, config):  # another builder won the race
                shutil.rmtree(tmp, ignore_errors=True)
                return out
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def weights_digest(model_dir: str | os.PathLike[str]) -> str:
    """sha256 of the safetensors file: a cheap way to tell two builds apart or equal."""
    return hashlib.sha256((Path(model_dir) / "model.safetensors").read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rljob_client.tinymodel", description=__doc__.split("\n")[0]
    )
    parser.add_argument("out_dir", help="directory to write the model into (reused if already built)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = parser.parse_args(argv)
    path = build_tiny_model(args.out_dir, seed=args.seed)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
