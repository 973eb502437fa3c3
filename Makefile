# Everything a fresh machine needs is installed from here (see README).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch is pinned to one version; whether pip takes its CPU or CUDA build depends on the index it
	# is configured with (README, "Install": the CPU index URL for a machine without a GPU).
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[torch,dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/fabricpace demo

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/mypy

# The quick benchmarks with short arguments: about 4 minutes on 2 cores (211 s at load 4-6), each under a
# minute. The long ones (pacing_unseen2, pacing_stress, full pacing_sim/pacing_real/diagnose_real, ...)
# are run by hand: benchmarks/README.md.
bench: $(STAMP)
	@set -e; out=$$(mktemp -d /tmp/fabricpace-bench.XXXXXX); echo "bench outputs: $$out"; \
	for b in \
	  "maxmin_solve.py" \
	  "collective_accuracy.py" \
	  "sim_speed.py --quick" \
	  "window_scale.py" \
	  "observer_overhead.py --cpu-only --cpu-reps 10" \
	  "clock_align.py --worlds 8" \
	  "diagnose_accuracy.py --seeds 2 --out $$out/accuracy" \
	  "diagnose_scale.py --cases syn256 --repeats 1 --out $$out/diagnose-scale" \
	  "report_scale.py --nodes 4 --steps 200 --repeats 1 --out $$out/report-scale" \
	  "kineto_import.py --sizes 10 --repeats 1 --no-hta" \
	  "pacing_sim.py --only paper --seeds 2" \
	  "pacing_transient.py --setup paper --nodes 4 --seeds 2 --no-short" \
	  "pacing_real.py --hotpath --window 25" \
	  "pacing_unseen2.py --only h03" \
	  "pacing_stress.py --bad-files" \
	  "diagnose_real.py run --out $$out/real --cases compute --repeats 1 --loads 0 --steps 100" \
	  "diagnose_real.py score --out $$out/real" \
	  "gpu_check.py --cpu --quick --out $$out/gpu-check" \
	; do echo "== benchmarks/$$b"; $(BIN)/python benchmarks/$$b; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
