# syntax=docker/dockerfile:1
# The engine image: `dtrain build-engine` with TensorRT 10, CUDA and PyTorch, as the
# operator's engine Job runs it (spec.engine.image). NVIDIA's PyTorch image carries a
# TensorRT 10 build matched to its CUDA and torch (25.01: TensorRT 10.8, torch 2.6, CUDA 12.8);
# torch holds the engine's GPU buffers and runs the PyTorch eager baseline.
# Build from the repository root:
#   docker build -f trainer_image/engine.Dockerfile -t ghcr.io/dtrain-dev/dtrain-engine:0.1.0 .
# (trainer_image/engine.Dockerfile.dockerignore keeps the build context to the package sources.)
# A user's own model class must be importable here too for the PyTorch baseline: build
# FROM this image with your package installed, and set spec.engine.image to it.

# Without TensorRT (CI: a Debian base, CPU only) build with
#   --build-arg DTRAIN_EXTRA=trainer --build-arg REQUIRE_TENSORRT=0 --build-arg TORCH_PACKAGES="torch==... torchvision==..."
# and `dtrain build-engine` says that TensorRT is missing, then checks the model with ONNX
# Runtime (--fallback onnxruntime).
ARG BASE_IMAGE=nvcr.io/nvidia/pytorch:25.01-py3
FROM ${BASE_IMAGE}
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_CERT
ARG TORCH_PACKAGES=
ARG DTRAIN_EXTRA=tensorrt
ARG REQUIRE_TENSORRT=1
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# torch first, in a layer of its own: a change to dtrain's sources reuses it (a base with torch skips it).
RUN if [ -n "$TORCH_PACKAGES" ]; then pip install --no-cache-dir $TORCH_PACKAGES; fi
COPY pyproject.toml README.md ./
# Only what the engine Job runs: the API layer, the `dtrain` command (the Job runs `dtrain build-engine`,
# rendered by dtrain_operator.core.render.engine_command), the engine and what it shares with the
# trainer. The trainer comes too, not for its code but for the built-in model classes
# (dtrain_trainer.models) that the PyTorch baseline builds from artifacts.json's classPath.
COPY operator/dtrain_operator/__init__.py operator/dtrain_operator/py.typed operator/dtrain_operator/
COPY operator/dtrain_operator/api operator/dtrain_operator/api
COPY operator/dtrain_operator/cli operator/dtrain_operator/cli
COPY trainer_image/dtrain_engine trainer_image/dtrain_engine
COPY trainer_image/dtrain_common trainer_image/dtrain_common
COPY trainer_image/dtrain_trainer trainer_image/dtrain_trainer
# Keep the base image's torch, torchvision and TensorRT: pin what is installed so that pip
# never replaces them with PyPI builds (NVIDIA's own constraints, if any, still apply).
RUN pip list --format=freeze | grep -iE '^(torch|torchvision|tensorrt|tensorrt[-_]cu[0-9]+.*|numpy)==' > /tmp/base-pins.txt \
 && PIP_CONSTRAINT="${PIP_CONSTRAINT:+$PIP_CONSTRAINT }/tmp/base-pins.txt" \
    pip install --no-cache-dir ".[${DTRAIN_EXTRA}]" \
 && rm -rf /src /tmp/base-pins.txt \
 && if [ "$REQUIRE_TENSORRT" = 1 ]; then python -c "import tensorrt, torch; assert tensorrt.__version__.split('.')[0] == '10', tensorrt.__version__; print('TensorRT', tensorrt.__version__, 'torch', torch.__version__)"; fi
WORKDIR /workspace
# Non-root and numeric, so that the pod's runAsNonRoot can verify it; the same user as the
# trainer image (contract.WORKLOAD_UID), so that the engine can write next to the files
# training left on the shared volume. HOME is writable for TensorRT's and torch's caches.
ENV HOME=/tmp
USER 10001:0
ENTRYPOINT ["dtrain", "build-engine"]
