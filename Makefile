# Two commands for a user: `make test` and `make demo`. Each sets itself up from pinned versions.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONSTRAINTS := requirements/constraints.txt
export PIP_CONSTRAINT := $(abspath $(CONSTRAINTS))
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: test demo lint bench docs lock clean check-java check-postgres check-clickhouse

# editable_mode=compat puts the checkout itself on sys.path, so Spark's lookup of top-level pyspark_*
# modules (zero-registration of the formats) finds them as it would in an installed wheel.
$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "sluice needs Python >= 3.11 (set PYTHON=python3.11)"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c $(CONSTRAINTS) -e '.[dev]' --config-settings editable_mode=compat
	touch $(STAMP)

check-java:
	@command -v java >/dev/null 2>&1 || { echo "Java 17 is required by Spark and was not found. Install it: apt-get install -y openjdk-17-jre-headless" >&2; exit 1; }

# The PostgreSQL tests start a real server from Debian's binaries (or use SLUICE_TEST_PG_URL).
check-postgres:
	@if [ -z "$$SLUICE_TEST_PG_URL" ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing the PostgreSQL server (Debian package postgresql) for the tests"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null || exit 1; \
	  else \
	    echo "The PostgreSQL tests need the server binaries: apt-get install -y postgresql (or set SLUICE_TEST_PG_URL)" >&2; exit 1; \
	  fi; \
	fi

# The ClickHouse tests start a real server from Debian's clickhouse-server package (18.16 on bookworm).
check-clickhouse:
	@if ! test -x /usr/sbin/clickhouse-server && ! command -v clickhouse-server >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing the ClickHouse server (Debian package clickhouse-server) for the tests"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clickhouse-server >/dev/null || exit 1; \
	  else \
	    echo "The ClickHouse tests need the server binary: apt-get install -y clickhouse-server" >&2; exit 1; \
	  fi; \
	fi

lint: $(STAMP)
	$(VENV)/bin/ruff check sluice tests bench pyspark_*.py

test: $(STAMP) check-java check-postgres check-clickhouse lint
	$(PY) -m pytest

demo: $(STAMP) check-java check-postgres
	$(PY) -m sluice.demo

docs: $(STAMP)
	$(PY) -m sluice.docgen --write

bench: $(STAMP) check-java check-postgres check-clickhouse
	$(PY) bench/engine_throughput.py
	$(PY) bench/s2_server.py
	$(PY) bench/s2_sink.py
	$(PY) bench/s2_source.py
	$(PY) bench/s2_many_streams.py
	$(PY) bench/faults.py
	@test -f /usr/share/java/postgresql.jar || { [ "$$(id -u)" = 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libpostgresql-jdbc-java >/dev/null; } || { echo "bench/postgres.py needs Spark's JDBC baseline: apt-get install -y libpostgresql-jdbc-java" >&2; exit 1; }
	$(PY) bench/postgres.py
	$(PY) bench/tablestore.py

# Re-resolve the pinned set from pyproject.toml (a maintainer's step, not a user's).
lock:
	rm -rf /tmp/sluice-lock && $(PYTHON) -m venv /tmp/sluice-lock
	PIP_CONSTRAINT= /tmp/sluice-lock/bin/pip install -q '.[dev]'
	{ echo "# Pinned versions: every machine resolves this exact set. Regenerate with 'make lock'."; \
	  PIP_CONSTRAINT= /tmp/sluice-lock/bin/pip freeze --all --exclude sluice --exclude pip | sort -f; } > $(CONSTRAINTS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
