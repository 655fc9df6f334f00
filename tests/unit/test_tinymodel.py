"""The tiny model builder: a shape vLLM's CPU build accepts, deterministic, cached by content."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rljob_client import tinymodel as tm


def test_default_shape_is_one_vllm_cpu_attention_accepts() -> None:
    cfg = tm.DEFAULT_CONFIG
    assert cfg.head_dim >= 32  # the CPU attention backend rejects head_dim 16
    assert cfg.num_attention_heads * cfg.head_dim == cfg.hidden_size
    assert cfg.num_attention_heads % cfg.num_key_value_heads == 0
    assert cfg.tie_word_embeddings is False
    assert cfg.max_position_embeddings >= 512


def test_stamp_names_builder_version_seed_and_shape() -> None:
    assert tm.builder_stamp(0) != tm.builder_stamp(1)
    assert tm.builder_stamp(3)["builder_version"] == tm.BUILDER_VERSION
    smaller = tm.TinyModelConfig(vocab_size=500)
    assert tm.builder_stamp(0) != tm.builder_stamp(0, smaller)


def test_corpus_does_not_depend_on_anything_random() -> None:
    assert tm.corpus_lines() == tm.corpus_lines()


def test_tokenizer_reaches_target_vocab_with_special_tokens_first() -> None:
    tok = tm.build_tokenizer(1000)
    assert len(tok) == 1000
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    text = "The controller updates weights: 128 samples!"
    assert tok.decode(tok.encode(text)) == text
    assert "assistant: " in tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )


def test_a_directory_without_weights_is_not_complete(tmp_path: Path) -> None:
    (tmp_path / tm.MARKER).write_text(json.dumps(tm.builder_stamp(0)))
    assert not tm.is_complete(tmp_path, 0)


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {
        "a0": tm.build_tiny_model(root / "a0", seed=0),
        "b0": tm.build_tiny_model(root / "b0", seed=0),
        "c1": tm.build_tiny_model(root / "c1", seed=1),
    }


def test_same_seed_gives_identical_files(builds: dict[str, Path]) -> None:
    assert tm.weights_digest(builds["a0"]) == tm.weights_digest(builds["b0"])
    assert (builds["a0"] / "tokenizer.json").read_bytes() == (builds["b0"] / "tokenizer.json").read_bytes()


def test_other_seed_gives_other_weights_same_tokenizer(builds: dict[str, Path]) -> None:
    assert tm.weights_digest(builds["a0"]) != tm.weights_digest(builds["c1"])
    assert (builds["a0"] / "tokenizer.json").read_bytes() == (builds["c1"] / "tokenizer.json").read_bytes()


def test_saved_config_is_the_declared_shape(builds: dict[str, Path]) -> None:
    saved = json.loads((builds["a0"] / "config.json").read_text())
    assert saved["architectures"] == ["LlamaForCausalLM"]
    for key in ("vocab_size", "hidden_size", "head_dim", "num_hidden_layers", "tie_word_embeddings"):
        assert saved[key] == getattr(tm.DEFAULT_CONFIG, key)
    assert tm.is_complete(builds["a0"], 0) and not tm.is_complete(builds["a0"], 1)


def test_complete_build_is_reused_and_other_seed_replaces_it(builds: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "m"
    tm.build_tiny_model(out, seed=0)
    before = (out / "model.safetensors").stat().st_mtime_ns
    tm.build_tiny_model(out, seed=0)
    assert (out / "model.safetensors").stat().st_mtime_ns == before
    tm.build_tiny_model(out, seed=1)
    assert tm.weights_digest(out) == tm.weights_digest(builds["c1"])
    assert not any(p.name.startswith(".m.") for p in tmp_path.iterdir())  # no temp dirs left behind
