# One entry point for developers and CI. `make test` is what CI runs (.ci/run calls it).
#   make demo   start the local stack (Kafka + SeaweedFS) and run the sidecar's main job on it
#   make test   lint, type-check and run every test tier against real components
# Downloads land in home caches only (~/.cache/pip, ~/.m2, ~/.cache/kafka-tiered-sidecar).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install lint type plugin test test-unit test-integration test-e2e demo stack-up stack-down clean check-python fuzz bench deploy-tools test-deploy build

check-python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11 or newer is required (found %s); install python3.11 and run make PYTHON=python3.11" % sys.version.split()[0])'

# Everything is installed in one resolver run: aiobotocore pins botocore exactly, and a second
# pip command could pull an incompatible botocore.
$(STAMP): pyproject.toml | check-python
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,dev,deploy,spark]'
	$(BIN)/python -m pip check
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check sidecar tests deploy
	$(BIN)/ruff format --check sidecar tests deploy

type: $(STAMP)
	$(BIN)/mypy --strict sidecar

# actionlint checks .github/workflows; pinned, so a new release cannot fail CI by itself
ACTIONLINT_VERSION ?= v1.7.12
GOBIN ?= $(HOME)/go/bin

# promtool (Debian's prometheus package), systemd-analyze and actionlint (Go module proxy, into
# ~/go/bin) for tests/deploy; each installed only when missing
deploy-tools:
	@if ! command -v actionlint >/dev/null && [ ! -x "$(GOBIN)/actionlint" ]; then \
	  if command -v go >/dev/null; then \
	    GOBIN="$(GOBIN)" go install github.com/rhysd/actionlint/cmd/actionlint@$(ACTIONLINT_VERSION); \
	  else echo "missing tool: actionlint (install Go, then run make deploy-tools)" >&2; exit 3; fi; \
	fi
	@missing=""; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v systemd-analyze >/dev/null || missing="$$missing systemd"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing; \
	  else echo "missing tools: sudo apt-get install -y --no-install-recommends$$missing" >&2; exit 3; fi; \
	fi

# The broker plugin (Kafka's RemoteStorageManager backed by the sidecar): compiles, runs its JUnit
# tests and builds deploy/kafka-plugin/target/kafka-tiered-sidecar-plugin.jar. Maven fetches into
# ~/.m2 on first use only. MVN unset: the mvn on PATH, else Apache Maven fetched from Maven
# Central into ~/.cache/kafka-tiered-sidecar/ (deploy/local/stack.py maven).
MVN ?=
plugin: | check-python
	@command -v java >/dev/null || { echo "missing tool: java (install OpenJDK 17: sudo apt-get install -y openjdk-17-jdk-headless)" >&2; exit 3; }
	@mvn="$(MVN)"; \
	if [ -z "$$mvn" ]; then mvn="$$(command -v mvn || $(PYTHON) deploy/local/stack.py maven)" || exit 3; fi; \
	command -v "$$mvn" >/dev/null || { echo "missing tool: $$mvn (install Maven: sudo apt-get install -y maven)" >&2; exit 3; }; \
	echo "$$mvn -B -q -C -Dstyle.color=never -f deploy/kafka-plugin/pom.xml package"; \
	"$$mvn" -B -q -C -Dstyle.color=never -f deploy/kafka-plugin/pom.xml package

# Every tier: unit, integration, e2e and deploy, against the real broker and S3 the session starts.
test: lint type deploy-tools plugin
	$(BIN)/python deploy/local/stack.py fetch
	$(BIN)/python -m pytest tests --durations=15

# wheel and sdist into dist/ (README "Installing"); --no-isolation uses the dev extra's hatchling
build: $(STAMP)
	$(BIN)/python -m build --no-isolation --outdir dist .

test-unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit

test-integration: $(STAMP)
	$(BIN)/python -m pytest tests/integration

test-e2e: $(STAMP)
	$(BIN)/python -m pytest tests/e2e

.PHONY: test-faults soak soak-broker

# S3 faults through a fault proxy, kill -9 at every step, full disks, socket security
# (part of `make test`; needs root for the tmpfs mounts and setpriv)
test-faults: $(STAMP)
	$(BIN)/python -m pytest tests/faults --durations=15

# 20 minutes under load with one S3 fault a minute, resources sampled (not in CI);
# SOAK_MINUTES=3 make soak for a short run
soak: $(STAMP)
	$(BIN)/python -m tests.faults.soak

# the same for the broker-driven mode: a broker with the plugin, Kafka consumers reading
# tiered data through it, the broker's copies and retention (not in CI)
soak-broker: $(STAMP) plugin
	$(BIN)/python -m tests.faults.soak_broker

test-deploy: $(STAMP) deploy-tools
	$(BIN)/python -m pytest tests/deploy

# 125,000 generated cases against the log-format parsers (about 4 min on 2 cores)
fuzz: $(STAMP)
	SIDECAR_FUZZ_EXAMPLES=10000 $(BIN)/python -m pytest -p no:cacheprovider -q tests/unit/kafka/test_kafka_fuzz.py tests/unit/kafka/test_kafka_fuzz_codecs.py --hypothesis-show-statistics

# benchmarks print ratios measured side by side in one run; results go to tests/bench/RESULTS.md
# each script prints ratios against a baseline run side by side; results: tests/bench/RESULTS.md
bench: $(STAMP)
	$(BIN)/python tests/bench/bench_kafka_format.py
	$(BIN)/python tests/bench/bench_metadata_store.py
	$(BIN)/python tests/bench/bench_tiering.py
	$(BIN)/python tests/bench/bench_read.py
	$(BIN)/python tests/bench/bench_scrub.py
	$(BIN)/python tests/bench/bench_upload_throttle.py
	$(BIN)/python tests/bench/bench_spark.py

demo: $(STAMP) plugin
	$(BIN)/python deploy/local/demo.py

stack-up: $(STAMP)
	$(BIN)/python deploy/local/stack.py up

stack-down:
	$(BIN)/python deploy/local/stack.py down

clean: stack-down
	rm -rf .stack
