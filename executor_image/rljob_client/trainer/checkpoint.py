"""Trainer checkpoints on disk: save and load, atomically, checked against a manifest of checksums.

A checkpoint is a directory `step-<N>/` under the checkpoint root (N: the next step to train):

- `model.safetensors`: every parameter and buffer in full precision (a tensor shared by two
  names, as tied embeddings are, is stored once; the manifest's `aliases` re-tie it);
- `optimizer.pt`: the optimizer's state_dict (`torch.save`; read back with `weights_only=True`,
  so a checkpoint can never run code);
- `rng.json`: the python, numpy and torch (CPU, and CUDA when present) RNG states of every
  rank, `{"ranks": [rank 0's, rank 1's, ...]}` (each rank resumes its own stream; a checkpoint
  written before per-rank states holds rank 0's state alone, `rank_rng` reads both);
- `manifest.json`: format, step, weight version, the executor's state (dataset position and
  pending rollouts, as the executor handed it over), and every file's size and sha256.

It is written into a hidden `.tmp-` sibling, every file and the directory fsynced, renamed
into place and the root fsynced: a crash mid-save leaves a `.tmp-` directory, which loading
ignores and the next save removes, and the previous checkpoints untouched. The newest `keep`
stay; checkpoints above the one just saved belong to a run that was abandoned and go too.

Loading checks every file against the manifest and names the one that is missing or does
not match. Which checkpoint a (re)started trainer begins from is `CheckpointStore.resume_point`:
none at all (first start) means start fresh; anything unreadable is refused rather than
silently trained over from the initial weights.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import random
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from rljob_client.errors import RLJobError

FORMAT = 1
MANIFEST = "manifest.json"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
RNG_FILE = "rng.json"
FILES = (MODEL_FILE, OPTIMIZER_FILE, RNG_FILE)
STEP_DIR = re.compile(r"^step-(\d+)$")
TMP_PREFIX = ".tmp-"


class CheckpointError(RLJobError):
    """A checkpoint that cannot be used; the message names the file or directory at fault."""


@dataclass
class Checkpoint:
    """Everything a trainer needs to continue at `step` as if it had never stopped."""

    step: int  # the next step to train (steps 0..step-1 are in the weights)
    weight_version: int  # the version these weights were pushed as
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    rng: dict[str, Any]
    executor: dict[str, Any] | None = None  # the executor's state after rollout step-1
    path: Path | None = field(default=None, compare=False)  # where it was loaded from or saved to


# ---- capturing and restoring live state ------------------------------------------------------


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers, detached and copied, tied names still sharing one copy.

    A copy, so that a save running beside the next step sees the weights of one moment.
    """
    out: dict[str, torch.Tensor] = {}
    copies: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))
        if key not in copies:
            copies[key] = tensor.detach().cpu().clone()
        out[name] = copies[key]
    return out


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state_dict, deep-copied for the same reason as `model_state`."""
    return copy.deepcopy(optimizer.state_dict())


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)


def capture_rng() -> dict[str, Any]:
    """python, numpy and torch RNG states as JSON-able data."""
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    out: dict[str, Any] = {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [np_name, np.asarray(np_keys).tolist(), int(np_pos), int(np_has_gauss), float(np_gauss)],
        "torch": _b64(torch.get_rng_state()),
    }
    if torch.cuda.is_available():
        out["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return out


def rank_rng(rng: dict[str, Any], rank: int) -> dict[str, Any] | None:
    """Rank `rank`'s RNG state in a checkpoint's `rng`, or None when the checkpoint has none for it
    (it was saved by fewer ranks, or before states were per rank: then it is rank 0's)."""
    if "ranks" not in rng:
        return rng if rank == 0 else None
    ranks = rng["ranks"]
    return ranks[rank] if rank < len(ranks) and ranks[rank] is not None else None


def restore_rng(state: dict[str, Any]) -> None:
    py_version, py_state, py_gauss = state["python"]
    random.setstate((py_version, tuple(py_state), py_gauss))
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = state["numpy"]
    np.random.set_state((np_name, np.asarray(np_keys, dtype=np.uint32), np_pos, np_has_gauss, np_gauss))
    torch.set_rng_state(_unb64(state["torch"]))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]])


def take_checkpoint(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, weight_version: int,
                    executor: dict[str, Any] | None = None) -> Checkpoint:
    """A trainer's state after training step `step - 1`, copied (a save may run beside the next step).

    Its RNG states are the calling rank's alone; the writer adds its peers' before saving
    (`trainer/resume.py`)."""
    return Checkpoint(step=step, weight_version=weight_version, model=model_state(model),
                      optimizer=optimizer_state(optimizer), rng={"ranks": [capture_rng()]}, executor=executor)


def restore_checkpoint(ckpt: Checkpoint, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int) -> bool:
    """Put `ckpt`'s weights, optimizer and rank `rank`'s own RNG states back; False when it holds no RNG
    state for that rank (the rank then keeps its seeded RNGs)."""
    model.load_state_dict(ckpt.model, strict=True)
    optimizer.load_state_dict(ckpt.optimizer)
    state = rank_rng(ckpt.rng, rank)
    if state is not None:
        restore_rng(state)
    return state is not None


# ---- the files -----------------------------------------------------------------------------------


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _unique_tensors(model: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors stored once, alias name -> stored name): safetensors refuses shared storage."""
    stored: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    first: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], str] = {}
    for name, t in model.items():
        key = (t.untyped_storage().data_ptr(), int(t.storage_offset()), tuple(t.shape), tuple(t.stride()))
        if key in first:
            aliases[name] = first[key]
            continue
        first[key] = name
        stored[name] = t.detach().contiguous().cpu()
    # Distinct views of one storage would still be refused: give each its own copy.
    ptrs: set[int] = set()
    for name, t in stored.items():
        ptr = t.untyped_storage().data_ptr()
        if ptr in ptrs:
            stored[name] = t.clone()
        ptrs.add(ptr)
    return stored, aliases


class CheckpointStore:
    """The checkpoints of one job: `ROOT/step-<N>/`, the newest `keep` of them."""

    def __init__(self, root: str | os.PathLike[str], keep: int = 2) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.root = Path(root)
        self.keep = keep

    def path_for(self, step: int) -> Path:
        return self.root / f"step-{step}"

    def steps(self) -> list[int]:
        """Steps with a checkpoint directory (complete or not: `load` tells), oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.root.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir())

    def strangers(self) -> list[Path]:
        """Entries that are neither a checkpoint nor an interrupted save's leftover."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir()
                      if not p.name.startswith(TMP_PREFIX) and not (STEP_DIR.match(p.name) and p.is_dir()))

    # -- save ------------------------------------------------------------------------------------

    def save(self, ckpt: Checkpoint) -> Path:
        """Write `ckpt` as `step-<N>/` atomically, prune, and return the directory."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.path_for(ckpt.step)
        tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}step-{ckpt.step}.", dir=self.root))
        try:
            stored, aliases = _unique_tensors(ckpt.model)
            save_file(stored, str(tmp / MODEL_FILE), metadata={"format": "pt"})
            torch.save(ckpt.optimizer, tmp / OPTIMIZER_FILE)
            (tmp / RNG_FILE).write_text(json.dumps(ckpt.rng))
            files = {}
            for name in FILES:
                _fsync(tmp / name)
                files[name] = {"bytes": (tmp / name).stat().st_size, "sha256": _sha256(tmp / name)}
            manifest = {
                "format": FORMAT,
                "step": ckpt.step,
                "weightVersion": ckpt.weight_version,
                "savedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "files": files,
                "aliases": aliases,
                "executor": ckpt.executor,
            }
            with (tmp / MANIFEST).open("w") as f:
                json.dump(manifest, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            _fsync(tmp)
            if final.exists():  # the same step saved again (a resumed run): swap, never leave a half dir
                old = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}old-{ckpt.step}.", dir=self.root))
                os.replace(final, old / final.name)
            os.replace(tmp, final)
            _fsync(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.prune(ckpt.step)
        ckpt.path = final
        return final

    def prune(self, current: int) -> list[Path]:
        """Keep `current` and the `keep - 1` newest below it; remove the rest and leftover temporaries."""
        older = [s for s in self.steps() if s < current]
        keep = {current, *older[max(0, len(older) - (self.keep - 1)):]}
        removed = [self.path_for(s) for s in self.steps() if s not in keep]
        removed += [p for p in self.root.iterdir() if p.name.startswith(TMP_PREFIX)]
        for p in removed:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        return removed

    # -- load ------------------------------------------------------------------------------------

    def load(self, step: int) -> Checkpoint:
        """The checkpoint of `step`, every file checked; CheckpointError names what is wrong."""
        d = self.path_for(step)
        mpath = d / MANIFEST
        if not d.is_dir():
            raise CheckpointError(f"checkpoint {d} does not exist")
        if not mpath.is_file():
            raise CheckpointError(f"checkpoint manifest {mpath} is missing (the checkpoint is incomplete)")
        try:
            manifest = json.loads(mpath.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"checkpoint manifest {mpath} is unreadable: {exc}") from exc
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
            raise CheckpointError(f"checkpoint manifest {mpath} has format {found!r}, expected {FORMAT}")
        files = manifest.get("files") or {}
        for name in FILES:
            path = d / name
            want = files.get(name)
            if not isinstance(want, dict):
                raise CheckpointError(f"checkpoint manifest {mpath} does not list {name}")
            if not path.is_file():
                raise CheckpointError(f"checkpoint file {path} is missing")
            if path.stat().st_size != want.get("bytes") or _sha256(path) != want.get("sha256"):
                raise CheckpointError(f"checkpoint file {path} is corrupt: its size or sha256 differs from {mpath}")
        try:
            model = load_file(str(d / MODEL_FILE))
            for alias, name in (manifest.get("aliases") or {}).items():
                model[alias] = model[name]
        except Exception as exc:  # checksums matched, so this is a writer's bug: still name the file
            raise CheckpointError(f"checkpoint file {d / MODEL_FILE} cannot be read: {exc}") from exc
        try:
            optimizer = torch.load(d / OPTIMIZER_FILE, weights_only=True)
        except Exception as exc:
            raise CheckpointError(f"checkpoint file {d / OPTIMIZER_FILE} cannot be read: {exc}") from exc
        try:
            rng = json.loads((d / RNG_FILE).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"checkpoint file {d / RNG_FILE} cannot be read: {exc}") from exc
        try:
            step_saved, version = int(manifest["step"]), int(manifest["weightVersion"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint manifest {mpath} lacks a valid step or weightVersion") from exc
        if step_saved != step:
            raise CheckpointError(f"checkpoint manifest {mpath} says step {step_saved}, its directory says {step}")
        return Checkpoint(step=step, weight_version=version, model=model, optimizer=optimizer, rng=rng,
                          executor=manifest.get("executor"), path=d)

    def resume_point(self, required: bool = False) -> Checkpoint | None:
        """Where a (re)started trainer begins: the newest checkpoint, or None on a first start.

        None only when the root holds nothing but an interrupted save's leftovers. A newest
        checkpoint that does not load is refused, not skipped: falling back silently would
        hide the damage (remove that directory to resume from the one before). Anything else
        in the root is refused too, as is an empty root when `required` (the user asked to
        resume, so starting from the initial weights would be an accident).
        """
        strangers = self.strangers()
        if strangers:
            raise CheckpointError(f"checkpoint directory {self.root} holds {strangers[0].name!r}, which is not a "
                                  "checkpoint (step-<N>/); move it away or point --checkpoint-dir elsewhere")
        steps = self.steps()
        if not steps:
            if required:
                raise CheckpointError(f"resume requested but checkpoint directory {self.root} holds no checkpoint")
            return None
        return self.load(steps[-1])
