"""Debezium's embedded engine as bench.latency's anchor: fetched from Maven Central (pinned), compiled once, run
on the benchmark's PostgreSQL beside sluice's query (bench/latency/DebeziumLatency.java)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlsplit

DEBEZIUM_VERSION = "3.6.1.Final"
SLF4J_VERSION = "1.7.36"  # the slf4j-api Debezium's dependencies bring
HOME = Path(os.environ.get("SLUICE_DEBEZIUM_HOME", Path.home() / ".cache" / "sluice" / f"debezium-{DEBEZIUM_VERSION}"))
SOURCE = Path(__file__).with_name("DebeziumLatency.java")

POM = """<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
<groupId>sluice.bench</groupId><artifactId>debezium-latency</artifactId><version>0</version><packaging>pom</packaging>
<dependencies>
<dependency><groupId>io.debezium</groupId><artifactId>debezium-embedded</artifactId><version>{v}</version></dependency>
<dependency><groupId>io.debezium</groupId><artifactId>debezium-connector-postgres</artifactId><version>{v}</version>
</dependency>
<dependency><groupId>org.slf4j</groupId><artifactId>slf4j-simple</artifactId><version>{slf4j}</version></dependency>
</dependencies></project>
"""


def classpath() -> str:
    """Debezium's jars (fetched once) and the compiled DebeziumLatency class (compiled when the source is newer)."""
    for tool in ("mvn", "javac", "java"):
        if shutil.which(tool) is None:
            raise SystemExit(f"the Debezium anchor needs {tool} (make check-java; apt-get install -y maven), or run "
                             "bench/latency/ with --no-debezium")
    lib, classes = HOME / "lib", HOME / "classes"
    if not (HOME / ".complete").is_file():
        with tempfile.TemporaryDirectory() as folder:
            pom = Path(folder) / "pom.xml"
            pom.write_text(POM.format(v=DEBEZIUM_VERSION, slf4j=SLF4J_VERSION))
            shutil.rmtree(lib, ignore_errors=True)
            subprocess.run(["mvn", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
                            "-DincludeScope=runtime", f"-DoutputDirectory={lib}"], check=True)
        (HOME / ".complete").touch()
    compiled = classes / "DebeziumLatency.class"
    if not compiled.is_file() or compiled.stat().st_mtime < SOURCE.stat().st_mtime:
        classes.mkdir(parents=True, exist_ok=True)
        subprocess.run(["javac", "-d", str(classes), "-cp", f"{lib}/*", str(SOURCE)], check=True)
    return f"{classes}:{lib}/*"


class Debezium:
    """One embedded engine on `table` through its own slot; stop() returns (commit_us, arrival_us) per change."""

    def __init__(self, pg_url: str, slot: str, publication: str, table: str) -> None:
        url = urlsplit(pg_url)
        self.out = Path(tempfile.mkdtemp(prefix="sluice-debezium-")) / "changes.txt"
        env = {**os.environ, "PGPASSWORD": unquote(url.password or "")}
        self.proc = subprocess.Popen(
            ["java", "-Xmx256m", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", classpath(),
             "DebeziumLatency", url.hostname or "127.0.0.1", str(url.port or 5432), url.path.lstrip("/"),
             unquote(url.username or "postgres"), slot, publication, table, str(self.out)],
            env=env, stdout=subprocess.PIPE, text=True)

    def wait_ready(self) -> None:
        """Until the connector's task runs (its slot exists: changes committed from now on reach it)."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip() == "READY":
                return
        raise RuntimeError(f"Debezium's engine exited ({self.proc.wait()}) before its task started; its log is above")

    def stop(self) -> list[tuple[int, int]]:
        self.proc.terminate()
        self.proc.wait(60)
        pairs = [tuple(int(v) for v in line.split()) for line in self.out.read_text().splitlines()]
        shutil.rmtree(self.out.parent, ignore_errors=True)
        return pairs  # type: ignore[return-value]
