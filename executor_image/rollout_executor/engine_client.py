"""The client a rollout function gets for the serving engines.

Every call goes through the executor's Generator, so the concurrency limit per engine, the
retries on other engines, the weight gate (no request starts during a weight update) and
the version stamp apply to each one. One client per rollout-function call: it remembers
the versions its calls ran on, which stamp the sample when the function gives none. It is
safe to call concurrently (e.g. several branches of one trajectory at once).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from rollout_executor.generation import Completion, Generator, SamplingParams
from rollout_executor.samples import SampleKey

Tokenizer = Any  # a transformers tokenizer (loaded on first use; the executor image may lack it)


class EngineClient:
    def __init__(self, generator: Generator, key: SampleKey, tokenizer: Callable[[], Tokenizer]) -> None:
        self._gen = generator
        self.key = key
        self._tokenizer = tokenizer
        self.versions: list[int] = []

    @property
    def sampling(self) -> SamplingParams:
        """spec.rollout.sampling: the defaults of every call."""
        return self._gen.sampling

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer (spec.model.tokenizer or the model path), for encode/decode and chat templates."""
        return self._tokenizer()

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True, **template_kwargs: Any) -> list[int]:
        """The model's chat template applied to `messages`, as token ids."""
        ids = self.tokenizer.apply_chat_template(list(messages), tokenize=True, add_generation_prompt=add_generation_prompt,
                                                 **template_kwargs)
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    async def generate(self, prompt: str | Sequence[int], *, max_tokens: int | None = None, temperature: float | None = None,
                       top_p: float | None = None, stop: Sequence[str] = ()) -> Completion:
        """One completion of `prompt` (token ids, or text the engine tokenizes), with token ids and logprobs."""
        s = self._gen.sampling
        sampling = replace(s, max_tokens=max_tokens if max_tokens is not None else s.max_tokens,
                           temperature=temperature if temperature is not None else s.temperature,
                           top_p=top_p if top_p is not None else s.top_p, stop=tuple(stop))
        p: str | list[int] = prompt if isinstance(prompt, str) else [int(t) for t in prompt]
        c = await self._gen.complete(self.key, p, sampling if sampling != s else None)
        self.versions.append(c.weight_version)
        return c

    async def chat(self, messages: Sequence[dict[str, Any]], **kw: Any) -> Completion:
        """The next assistant turn of `messages`, generated from the chat template's token ids."""
        return await self.generate(self.render(messages), **kw)
