import json
import uuid

import pytest
import urllib3

from sluice.testing import LocalElasticsearch, LocalOpenSearch


class Search:
    """The server under test, REST helpers and unique index names."""

    def __init__(self, server: LocalOpenSearch) -> None:
        self.server = server
        self.http = urllib3.PoolManager()

    def call(self, method: str, path: str, body=None, **params):
        query = "&".join(f"{k}={v}" for k, v in params.items())
        response = self.http.request(method, f"{self.server.url}{path}" + (f"?{query}" if query else ""),
                                     body=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        assert response.status < 300, (response.status, response.data[:1000])
        return json.loads(response.data) if response.data else None

    def index_name(self) -> str:
        return f"i-{uuid.uuid4().hex[:10]}"

    def docs(self, index: str) -> dict[str, dict]:
        """Every document of `index` by id (refreshed first)."""
        self.call("POST", f"/{index}/_refresh")
        hits = self.call("GET", f"/{index}/_search", {"size": 10_000, "query": {"match_all": {}}})["hits"]["hits"]
        return {h["_id"]: h["_source"] for h in hits}

    def count(self, index: str) -> int:
        """Documents searchable in `index` now (refreshed first); 0 while the node does not answer."""
        try:
            self.http.request("POST", f"{self.server.url}/{index}/_refresh", retries=False, timeout=2)
            response = self.http.request("GET", f"{self.server.url}/{index}/_count", retries=False, timeout=2)
        except urllib3.exceptions.HTTPError:
            return 0
        return json.loads(response.data).get("count", 0) if response.status == 200 else 0

    def opts(self, index: str, **more: str) -> dict[str, str]:
        return {"nodes": self.server.url, "index": index, **more}


ENGINES = {"opensearch": LocalOpenSearch, "elasticsearch": LocalElasticsearch}


@pytest.fixture(scope="package", params=list(ENGINES))
def search(request):
    """One node of each engine for this package's modules, one engine after the other, each test on indices of its
    own (its JVM stops with the package, not idling through the rest of the suite; a test that kills it starts it
    again on its data). The fault tests run on OpenSearch (its security plugin): their module has its own."""
    with ENGINES[request.param]() as server:
        yield Search(server)
