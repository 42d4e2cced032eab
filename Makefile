# simgpu: `make run` sets up a virtual environment and simulates a bundled example;
# `make test` runs the test suite. `make help` lists every target.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch's CPU build; a GPU machine may set TORCH= to keep the torch it has
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed-stamp
EXAMPLE ?= workloads/dlrm_2x_dgx_a100.yaml

.PHONY: help install run test lint docs images bench validate fit clean

help:  ## list the targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): setup.cfg pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(if $(TORCH),$(BIN)/python -m pip install -q "$(TORCH)")
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install simgpu with its dependencies

run: $(STAMP)  ## simulate the bundled example (EXAMPLE=workloads/...yaml) into out/
	$(BIN)/python -m simgpu.run $(EXAMPLE)

test: $(STAMP)  ## run the tests (unit, property, analytic, golden, validation)
	$(BIN)/python -m pytest -q

lint: $(STAMP)  ## ruff and mypy
	$(BIN)/ruff check simgpu tests
	$(BIN)/mypy

docs: $(STAMP)  ## regenerate the input reference (docs/reference) and build the site into site/
	$(BIN)/python -m simgpu.reference docs/reference
	$(BIN)/mkdocs build --strict -d site

images: $(STAMP)  ## regenerate the README's pictures in docs/images (the tour; stragglers, faults, mixed GPUs, shared clusters, goodput)
	$(BIN)/python -m simgpu run workloads/gpt_2x_dgx_h100.yaml --out out/tour/run
	$(BIN)/python -m simgpu whatif workloads/studies/faster_nic.yaml --out out/tour/whatif
	$(BIN)/python -m simgpu serve workloads/serving/llama2_70b_2x_dgx_h100_disagg.yaml --out out/tour/serve
	cp out/tour/run/timeline.png docs/images/tour-timeline.png
	cp out/tour/whatif/bars.png docs/images/tour-whatif.png
	cp out/tour/serve/latency_cdf.png docs/images/tour-latency-cdf.png
	$(BIN)/python -m simgpu whatif workloads/studies/straggler.yaml --out out/tour/straggler
	$(BIN)/python -m simgpu whatif workloads/studies/nic_down.yaml --out out/tour/nic_down
	$(BIN)/python -m simgpu run workloads/gpt_mixed_h100_a100.yaml --out out/tour/mixed
	$(BIN)/python -m simgpu cluster workloads/clusters/two_gpt_jobs_2to1_spine.yaml --out out/tour/cluster
	$(BIN)/python -m simgpu goodput workloads/goodput/llama3_405b_16k_h100.yaml --out out/tour/goodput
	cp out/tour/straggler/bars.png docs/images/clusters-straggler.png
	cp out/tour/nic_down/bars.png docs/images/clusters-nic-down.png
	cp out/tour/mixed/timeline.png docs/images/clusters-mixed-timeline.png
	cp out/tour/cluster/timeline.png docs/images/clusters-two-jobs-timeline.png
	cp out/tour/cluster/links.png docs/images/clusters-two-jobs-links.png
	cp out/tour/goodput/goodput.png docs/images/clusters-goodput.png

bench: $(STAMP)  ## measure the simulator's own speed and memory
	$(BIN)/python -m simgpu.speed --report docs/speed.md

fit: $(STAMP)  ## refit every shipped platform's kernel models (and the transfer models) from their data
	$(BIN)/python -m simgpu.fit --all

validate: $(STAMP)  ## compare predictions with real measurements in ../shared/data
	$(BIN)/python -m simgpu.validate

clean:  ## remove outputs and the virtual environment
	rm -rf out site $(VENV) .pytest_cache .mypy_cache .ruff_cache
