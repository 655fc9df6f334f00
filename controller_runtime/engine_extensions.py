"""Names of code we load into engine processes, in one pure module (the manifest builders,
local mode and the engine clients all name it; none of them may pull in the others' imports).
"""

from __future__ import annotations

# vLLM's --worker-extension-cls for the process-group weight transfer (weightUpdate.method
# gloo/nccl): `rljob_client.vllm_worker_extension`, inert until the trainer calls it, so
# local mode and the test servers always load it. An engine image must ship rljob_client.
WEIGHT_TRANSFER_EXTENSION = "rljob_client.vllm_worker_extension.WeightTransferExtension"
