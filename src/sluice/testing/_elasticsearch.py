"""A throwaway Elasticsearch server for tests: the real server (a JVM), one node on loopback, laid out, started and
stopped as LocalOpenSearch does (OpenSearch is a fork of Elasticsearch 7.10: the same layout, names aside).

The server is the `org.elasticsearch:elasticsearch` jar and its runtime dependencies from Maven Central, with the
`transport-netty4-client` module: `make check-elasticsearch` puts them into ~/.cache/sluice/elasticsearch-<version>
or $SLUICE_ELASTICSEARCH_HOME. 7.17 is the newest line published so (8.x and 9.x reach Maven Central for embedding,
without the module); its REST API is the one the connector uses on every Elasticsearch from 7.12 on: `_bulk`, `_pit`
with slices, `_shard_doc`. Without X-Pack (not on Maven Central), so no authentication: `auth=True` is refused
(the authentication test runs on OpenSearch). The server is under the Elastic License 2.0 or the SSPL.

`stop()` kills the node: Elasticsearch 7.17 started this way does not end on SIGTERM (its shutdown waits on Netty's
event loops), and a test server has nothing to flush.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sluice.testing._opensearch import LocalOpenSearch

# The one place the version is pinned: the Makefile's check-elasticsearch reads this line.
ELASTICSEARCH_VERSION = "7.17.29"
INSTALL_HINT = "fetch it from Maven Central with: make check-elasticsearch"

# The flags Elasticsearch's launcher gives every node (SystemJvmOptions of 7.17), as for OpenSearch.
SYSTEM_FLAGS = [
    "-Des.networkaddress.cache.ttl=60", "-Des.networkaddress.cache.negative.ttl=10",
    "-Djava.awt.headless=true", "-Dfile.encoding=UTF-8", "-XX:-OmitStackTraceInFastThrow",
    "-Dio.netty.noUnsafe=true", "-Dio.netty.noKeySetOptimization=true", "-Dio.netty.recycler.maxCapacityPerThread=0",
    "-Dio.netty.allocator.numDirectArenas=0", "-Dlog4j.shutdownHookEnabled=false", "-Dlog4j2.disable.jmx=true",
    "-Dlog4j2.formatMsgNoLookups=true", "-Djava.locale.providers=SPI,COMPAT",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "-Djna.nosys=true", "-Djna.nounpack=true", "-Djna.boot.library.path=/nonexistent",
    "-Des.distribution.flavor=default", "-Des.distribution.type=tar", "-Des.bundled_jdk=false",
]

NETTY4_DESCRIPTOR = f"""\
description=Netty 4 based transport implementation
version={ELASTICSEARCH_VERSION}
name=transport-netty4
classname=org.elasticsearch.transport.Netty4Plugin
java.version=1.8
elasticsearch.version={ELASTICSEARCH_VERSION}
extended.plugins=
has.native.controller=false
licensed=false
"""

# The netty4 module's security policy, by jar (Elasticsearch 7.17 refuses a module's global grants and wildcard
# RuntimePermissions, which OpenSearch's policy has).
NETTY4_POLICY = """\
grant codeBase "${codebase.netty-common}" {
  permission java.io.FilePermission "/proc/sys/net/core/somaxconn", "read";
  permission java.net.SocketPermission "*", "accept,connect";
  permission java.lang.RuntimePermission "setContextClassLoader";
};
grant codeBase "${codebase.netty-transport}" {
  permission java.net.SocketPermission "*", "accept,connect";
};
"""


def elasticsearch_home() -> Path:
    """The folder `make check-elasticsearch` fills: $SLUICE_ELASTICSEARCH_HOME, else
    ~/.cache/sluice/elasticsearch-<version>."""
    home = os.environ.get("SLUICE_ELASTICSEARCH_HOME")
    return Path(home) if home else Path.home() / ".cache" / "sluice" / f"elasticsearch-{ELASTICSEARCH_VERSION}"


def find_classpath() -> str:
    """The server's classpath (RuntimeError saying how to fetch it, when `make check-elasticsearch` has not)."""
    home = elasticsearch_home()
    server_jar = home / "lib" / f"elasticsearch-{ELASTICSEARCH_VERSION}.jar"
    if not (home / ".complete").is_file() or not server_jar.is_file():
        raise RuntimeError(f"Elasticsearch {ELASTICSEARCH_VERSION} was not found in {home}; {INSTALL_HINT}")
    return os.pathsep.join(str(j) for j in sorted((home / "lib").glob("*.jar")))


class LocalElasticsearch(LocalOpenSearch):
    """Context manager: a fresh one-node Elasticsearch cluster; `.url`, `request()`, `kill()` and `start()` as in
    LocalOpenSearch."""

    server = "Elasticsearch"
    config_file = "elasticsearch.yml"
    main_class = "org.elasticsearch.bootstrap.Elasticsearch"
    property_prefix = "es"
    system_flags = SYSTEM_FLAGS
    netty4_files = (NETTY4_DESCRIPTOR, NETTY4_POLICY)

    def __init__(self, *, auth: bool = False, **options: Any) -> None:
        if auth:
            raise ValueError("LocalElasticsearch has no authentication: X-Pack is not on Maven Central "
                             "(use LocalOpenSearch(auth=True))")
        super().__init__(**options)

    @staticmethod
    def _home() -> Path:
        return elasticsearch_home()

    @staticmethod
    def _classpath() -> str:
        return find_classpath()

    def _environment(self) -> dict[str, str]:
        assert self._dir is not None  # the node checks that its temporary folders are given and exist
        return {**os.environ, "ES_TMPDIR": f"{self._dir}/tmp", "LIBFFI_TMPDIR": f"{self._dir}/tmp"}

    def stop(self, *, keep_data: bool = False) -> None:
        self.kill()
        super().stop(keep_data=keep_data)
