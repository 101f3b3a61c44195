"""Hadoop's *-site.xml configuration files (hbase-site.xml, core-site.xml), written from a dict."""

from __future__ import annotations

from typing import Any
from xml.sax.saxutils import escape


def site_xml(properties: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        return str(v).lower() if isinstance(v, bool) else str(v)

    return ('<?xml version="1.0"?>\n<configuration>\n' + "".join(
        f"  <property><name>{escape(k)}</name><value>{escape(value(v))}</value></property>\n"
        for k, v in properties.items()) + "</configuration>\n")
