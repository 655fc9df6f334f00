"""What every engine process we start is given beyond the user's args (code we load into it,
settings our own code relies on), in one pure module: the manifest builders, local mode and
the engine clients all name it, and none of them may pull in the others' imports.
"""

from __future__ import annotations

# vLLM's --worker-extension-cls for the process-group weight transfer (weightUpdate.method
# gloo/nccl): `rljob_client.engine.vllm_worker_extension`, inert until the trainer calls it, so
# local mode and the test servers always load it. An engine image must ship rljob_client.
WEIGHT_TRANSFER_EXTENSION = "rljob_client.engine.vllm_worker_extension.WeightTransferExtension"

# vLLM reports raw logprobs (before temperature and top-p) by default; the trainer's off-policy
# correction needs the logprobs of the distribution each token was actually drawn from.
VLLM_LOGPROBS_ARGS = ("--logprobs-mode", "processed_logprobs")
