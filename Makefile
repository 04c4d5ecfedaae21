# nodedeck: `make demo` runs the whole product locally, `make test` runs every test.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip -q --disable-pip-version-check
STAMP  := $(VENV)/.installed

.PHONY: demo demo-headless test lint bench system-tools clean

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install torch==2.13.0 2>&1 | grep -v "is ignored" || true
	$(PIP) install -e '.[trainer,test]' 2>&1 | grep -v "is ignored" || true
	$(PIP) install --no-deps specforge==0.2.0 2>&1 | grep -v "is ignored" || true
	$(PY) -c "import torch, transformers, textual, paramiko, moto" 
	@touch $(STAMP)

# Root on a fresh Debian machine: bring the system tools the tests and the demo use.
system-tools:
	@missing=""; \
	test -x /usr/sbin/sshd || missing="$$missing openssh-server"; \
	command -v tmux >/dev/null || missing="$$missing tmux"; \
	command -v rsync >/dev/null || missing="$$missing rsync"; \
	command -v scp >/dev/null || missing="$$missing openssh-client"; \
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

test: system-tools $(STAMP) lint
	$(PY) -m pytest -q -p no:cacheprovider
	sh bench/run_ci.sh $(PY)
	.ci/base-install-check
	$(VENV)/bin/nodedeck demo --headless --work $(CURDIR)/demo-work

# ruff (lint, import order, 120 columns) over everything; mypy over ops/ (settings in pyproject.toml)
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy

bench: system-tools $(STAMP)
	for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
