# syntax=docker/dockerfile:1
# The operator image: kopf + kubernetes client + controller_runtime. No torch, vLLM or Ray.
# BASE: a Debian image with CPython 3.11 as `python`; scripts/build-images passes one made from
# Debian's packages. The default is pinned by exact tag (a digest cannot be resolved on the
# build machines, which have no registry access; pin a digest in your own mirror).
ARG BASE=python:3.11.11-slim-bookworm
FROM ${BASE} AS build
WORKDIR /src
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/rljob
# Exactly the tested versions, hashes checked (requirements/operator.lock, from scripts/lock),
# then the project without dependencies: nothing unpinned is downloaded.
COPY requirements/operator.lock ./requirements/
RUN /opt/rljob/bin/pip install --no-compile --require-hashes --no-deps -r requirements/operator.lock
COPY pyproject.toml README.md ./
COPY controller_runtime ./controller_runtime
COPY operator ./operator
COPY executor_image/rollout_executor ./executor_image/rollout_executor
COPY executor_image/rljob_client ./executor_image/rljob_client
RUN /opt/rljob/bin/pip install --no-compile --no-deps --no-build-isolation . \
 && /opt/rljob/bin/python -c "import rljob_operator, controller_runtime, kopf, kubernetes"

FROM ${BASE}
LABEL org.opencontainers.image.title="rljob-operator" \
      org.opencontainers.image.description="Kubernetes operator for RLJob (RL post-training of LLMs)" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/rljob /opt/rljob
ENV PATH=/opt/rljob/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
ENTRYPOINT ["rljob-operator"]
