# flowrl: `make demo` runs the embedded default job, `make test` the whole suite.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo demo-toy test venv bench bench-toy bench-t2i bench-rewards bench-remote bench-shapes bench-demo bench-driving bench-driving-splits bench-robot clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.14.1 torchvision==0.29.1 || $(BIN)/pip install -q torch torchvision
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	FLOWRL_NUM_THREADS=2 $(BIN)/flowrl train configs/t2i/shapes_fdfo.yaml output_dir=outputs/demo overwrite=true

demo-toy: $(STAMP)
	FLOWRL_NUM_THREADS=1 $(BIN)/flowrl train configs/toy/fdfo.yaml output_dir=outputs/demo_toy overwrite=true

test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=15 tests

bench: bench-toy bench-t2i bench-rewards bench-remote bench-shapes bench-driving bench-driving-splits bench-robot

bench-toy: $(STAMP)
	FLOWRL_NUM_THREADS=1 $(BIN)/python tests/benchmarks/bench_toy.py --out outputs/bench_toy.json

bench-t2i: $(STAMP)
	$(BIN)/python tests/benchmarks/bench_t2i.py --out outputs/bench_t2i.json

bench-rewards: $(STAMP)
	FLOWRL_NUM_THREADS=1 $(BIN)/python tests/benchmarks/bench_rewards.py --out outputs/bench_rewards.json

bench-shapes: $(STAMP)
	$(BIN)/python tests/benchmarks/bench_shapes.py --out outputs/bench_shapes.json

bench-demo: $(STAMP)
	FLOWRL_NUM_THREADS=2 $(BIN)/python tests/benchmarks/bench_shapes.py --algorithms fdfo --out outputs/bench_demo.json

bench-driving: $(STAMP)
	$(BIN)/python tests/benchmarks/bench_driving_sim.py --threads 2 --scenes 256 --out outputs/bench_driving_sim.json

bench-driving-splits: $(STAMP)
	$(BIN)/python tests/benchmarks/bench_driving_splits.py --out outputs/bench_driving_splits.json

bench-robot: $(STAMP)
	FLOWRL_NUM_THREADS=1 $(BIN)/python tests/benchmarks/bench_robot.py --jobs 2 --out outputs/bench_robot.json

bench-remote: $(STAMP)
	$(BIN)/python tests/benchmarks/bench_remote.py --out outputs/bench_remote.json

clean:
	rm -rf outputs
