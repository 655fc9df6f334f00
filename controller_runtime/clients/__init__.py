"""Engine HTTP clients (vLLM, SGLang) behind controller_runtime.ports.EngineClient."""

from controller_runtime.clients.completions import Completion, CompletionChoice
from controller_runtime.clients.factory import make_engine_client
from controller_runtime.clients.sglang import SGLangClient
from controller_runtime.clients.vllm import VLLMClient

__all__ = ["Completion", "CompletionChoice", "SGLangClient", "VLLMClient", "make_engine_client"]
