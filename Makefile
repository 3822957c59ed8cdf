# The two commands of the README's quick start, on a fresh machine:
#   make demo   installs what is missing, then runs examples/quickstart.yaml end to end
#   make test   installs what is missing, then runs the gates (make lint) and the whole test suite
#   make lint   the gates alone, fastest first: ruff, the layering contracts, mypy, module and function sizes
#   make cluster        a real Kubernetes control plane (upstream, built from its Go modules), NODES
#                       kubelets and the operator, in the background (root); .cluster/kubeconfig
#   make cluster NODES=3 GPUS_PER_NODE=1   more nodes, each with an nvidia.com/gpu count
#   make cluster PODS_FROM=host   containers from this machine's .venv, not their images (quick loops)
#   make cluster SCHEDULERS=coscheduling   also scheduler-plugins' coscheduling scheduler (schedulerName
#                       scheduler-plugins-scheduler) and its PodGroup CRD, built from tools/cluster/coscheduling
#   make cluster KUEUE=1   and Kueue, built from its Go module (tools/cluster/kueue; first time ~8 min)
#   make cluster-join   one more node in the running cluster (the next index; the CPU, memory and GPUs
#                       of make cluster's nodes), returns when it is Ready (root)
#   make cluster-down   stops it all and removes its state; make cluster-status says what runs
#   make e2e    every end-to-end scenario on the real control plane (tests/cluster: starts one unless
#               one runs, and stops it after) (root)
#   make e2e JOB=path/to/job.yaml   one job file through kubectl apply on that cluster, to its end
#   make bench-anchors   dtrain against JobSet, Kubeflow Trainer (TrainJob) and PyTorchJob on the running
#               cluster (make cluster NODES=3 first): their controllers built from tools/cluster/anchors
#               and installed, then bench/anchors.py's table (about 40 minutes; SYSTEMS=dtrain,jobset,...)
# Images (docker, podman or buildah, whichever is here; see tools/build-images.sh):
#   make images REGISTRY=registry.example.com/ml VERSION=0.1.0
#   make push   REGISTRY=registry.example.com/ml VERSION=0.1.0
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch and torchvision are pinned, so that pip never resolves a second multi-GB build; where no local
# wheel cache or index serves them, they download from PyPI (the CUDA build of torch: several GB).
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
INSTALLED := $(VENV)/.dtrain-installed
TOOLS := .tools/bin/helm .tools/bin/kubectl
# The tests' S3 server (the Versity S3 Gateway, built from its pinned Go module: a minute or two the first time, then cached).
S3SERVER := .tools/bin/versitygw
# Upstream etcd, kube-apiserver, controller manager and scheduler in one binary, built from their pinned Go
# modules (tools/cluster/controlplane: about 10 minutes on 2 cores the first time, then cached): the tests'
# real API server (tests/control_plane.py) and make cluster's control plane. The build needs only Python's
# standard library, so that it runs beside make install.
CONTROLPLANE := .cluster/bin/controlplane

# Where the images go: $(REGISTRY)/dtrain-{operator,trainer,engine}:$(VERSION).
REGISTRY ?= localhost/dtrain
VERSION ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)

.PHONY: install tools controlplane lint test e2e demo crd manifests clean images push cluster cluster-join cluster-down cluster-status \
	cluster-build bench-anchors

NODES ?= 2
GPUS_PER_NODE ?= 0
# images: each container from its image (built when missing); host: from this machine's .venv (quick loops).
PODS_FROM ?= images
# Second schedulers beside kube-scheduler (comma-separated): coscheduling (scheduler-plugins, built the first time).
SCHEDULERS ?=
LOCALCLUSTER := cd tools/cluster && OMP_NUM_THREADS=1 $(abspath $(PY)) -m localcluster

install: $(INSTALLED)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(INSTALLED): pyproject.toml | $(PY)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install $(TORCH_PINS)
	$(PIP) install -e '.[operator,trainer,dev]' $(TORCH_PINS)
	# The complete typed API of TensorRT 10, to type-check the engine builder (no GPU needed).
	$(PIP) install --no-deps 'tensorrt-stubs>=10,<11'
	touch $@

tools: $(TOOLS)

controlplane: $(CONTROLPLANE)

$(CONTROLPLANE): tools/cluster/controlplane/go.mod tools/cluster/controlplane/go.sum tools/cluster/controlplane/main.go
	cd tools/cluster && $(PYTHON) -c 'from localcluster import controlplane; controlplane.build()'

# One run of the script makes both (a grouped target: make -j never runs it twice at once).
$(TOOLS) &: tools/install-k8s-tools.sh | $(INSTALLED)
	PIP="$(PIP)" bash tools/install-k8s-tools.sh

# The gates read this checkout's sources (not whichever one the environment's editable install names).
THIS_CHECKOUT := PYTHONPATH=operator:trainer_image

lint: $(INSTALLED)
	$(VENV)/bin/ruff check operator trainer_image tests bench tools
	$(THIS_CHECKOUT) $(VENV)/bin/lint-imports
	$(PY) -m mypy
	$(PY) tools/check_layout.py operator trainer_image tools tests bench

$(S3SERVER): tools/s3server/go.mod tools/s3server/go.sum tools/s3server/build.sh
	bash tools/s3server/build.sh $@

# Two pytest workers (pytest-xdist), each test taken by whichever is free: half of the suite's time
# is spent waiting (for a timeout, a hang to be caught, a process to start), so two share 2 cores
# well (22 min instead of 34 here). TEST_WORKERS=0 runs the tests in one process.
TEST_WORKERS ?= 2
test: lint $(TOOLS) $(S3SERVER) $(CONTROLPLANE)
	OMP_NUM_THREADS=1 $(PY) -m pytest --durations=25 $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist worksteal)

# Root and network namespaces (ip netns, veth, bridge): see the README's "End to end" section.
# E2E_QUICKSTART_MAX_STEPS=N shortens the quick start scenario on a slow machine (maxSteps only);
# E2E_PODS_FROM=host runs the pods from this checkout's .venv instead of their images.
e2e: $(INSTALLED) $(TOOLS)
	bash tools/install-e2e-deps.sh
	OMP_NUM_THREADS=1 $(PY) -m tests.cluster $(if $(JOB),--job $(JOB))

cluster: $(INSTALLED) $(TOOLS)
	bash tools/install-e2e-deps.sh
	$(LOCALCLUSTER) up --nodes $(NODES) --gpus-per-node $(GPUS_PER_NODE) --pods-from $(PODS_FROM) \
		--schedulers "$(SCHEDULERS)" $(if $(KUEUE),--kueue)

# The Go builds make e2e needs (the control plane, scheduler-plugins, Kueue), nothing started: CI runs it beside make test.
cluster-build: $(INSTALLED)
	$(LOCALCLUSTER) build --schedulers coscheduling --kueue

# Not in make test nor in CI: it needs a running cluster and takes about 40 minutes (bench/anchors.py).
bench-anchors: $(INSTALLED) $(TOOLS)
	$(LOCALCLUSTER) anchors
	OMP_NUM_THREADS=1 $(PY) -m bench.anchors $(if $(SYSTEMS),--systems $(SYSTEMS))

# What a running cluster was made with (the environment, kubectl) is there already: nothing to install.
cluster-join:
	$(LOCALCLUSTER) join

cluster-down:
	$(LOCALCLUSTER) down

cluster-status:
	$(LOCALCLUSTER) status

demo: $(INSTALLED)
	OMP_NUM_THREADS=1 $(VENV)/bin/dtrain run examples/quickstart.yaml

# Regenerate the CRD, the chart's CRD, docs/api.md and manifests/ from the model and the chart.
manifests: $(INSTALLED) $(TOOLS)
	$(PY) tools/generate_manifests.py

# The operator, trainer and engine images, one at a time (each Dockerfile takes its base as
# BASE_IMAGE; OPERATOR_BASE, TRAINER_BASE, ENGINE_BASE, TORCH_PACKAGES... pass through).
images:
	REGISTRY="$(REGISTRY)" VERSION="$(VERSION)" bash tools/build-images.sh

push:
	REGISTRY="$(REGISTRY)" VERSION="$(VERSION)" bash tools/build-images.sh --push

clean:
	rm -rf dtrain-runs .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
