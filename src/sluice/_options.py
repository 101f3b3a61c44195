"""Option declarations: each option is declared once (name, type, default, range, meaning).

Parsing validates types, ranges and choices, rejects unknown keys with the closest match, and keeps
secrets out of every repr. The docs tables are generated from the same declarations (sluice.docgen).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Self, TypeVar

from sluice._errors import OptionError

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


@dataclass(frozen=True)
class Option:
    """One declared option. `kind` is one of: int, float, bool, str, choice, list, prefix. A prefix option is named
    `<prefix>.*` and collects every key under `<prefix>.` into one `PrefixSettings` (the prefix left off), those the
    spec declares on their own included, with their parsed value: a client's pass-through settings."""

    name: str
    kind: str
    default: Any
    meaning: str
    minimum: float | None = None  # int and float options
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    secret: bool = False
    required: bool = False

    def parse(self, raw: Any) -> Any:
        text = str(raw).strip()
        if self.kind == "str":
            return str(raw)
        if self.kind == "bool":
            low = text.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise OptionError(f"option '{self.name}' must be true or false, got {self._show(raw)}")
        if self.kind in ("int", "float"):
            try:
                value = int(text) if self.kind == "int" else float(text)
            except ValueError:
                what = "a whole number" if self.kind == "int" else "a number"
                raise OptionError(f"option '{self.name}' must be {what}, got {self._show(raw)}") from None
            if value != value:  # NaN passes every comparison below
                raise OptionError(f"option '{self.name}' must be a number, got {self._show(raw)}")
            if self.minimum is not None and value < self.minimum:
                raise OptionError(f"option '{self.name}' must be >= {self.minimum}, got {value}")
            if self.maximum is not None and value > self.maximum:
                raise OptionError(f"option '{self.name}' must be <= {self.maximum}, got {value}")
            return value
        if self.kind == "choice":
            low = text.lower()
            for choice in self.choices:
                if choice.lower() == low:
                    return choice
            raise OptionError(
                f"option '{self.name}' must be one of {', '.join(self.choices)}; got {self._show(raw)}"
            )
        if self.kind == "list":
            return tuple(part.strip() for part in text.split(",") if part.strip())
        raise AssertionError(f"unknown option kind {self.kind}")

    def _show(self, raw: Any) -> str:
        return "<redacted>" if self.secret else repr(str(raw))

    def range_text(self) -> str:
        if self.kind == "choice":
            return " \\| ".join(self.choices)
        if self.kind == "bool":
            return "true \\| false"
        if self.kind in ("int", "float"):
            low = "" if self.minimum is None else str(self.minimum)
            high = "" if self.maximum is None else str(self.maximum)
            return f"{low}..{high}" if (low or high) else "any"
        if self.kind == "list":
            return "comma-separated"
        if self.kind == "prefix":
            return f"any {self.name[:-1]}<setting>"
        return "text"

    def default_text(self) -> str:
        if self.required:
            return "(required)"
        if self.default is None:
            return "(none)"
        if isinstance(self.default, bool):
            return str(self.default).lower()
        if isinstance(self.default, tuple):
            return ",".join(self.default) or "(none)"
        return str(self.default)


# Settings under a prefix whose name says they hold a secret: redacted wherever the settings are shown.
SECRET_SETTING = re.compile(r"password|secret|token|credential|private|key\.pem|api[-_.]?key|jaas|"
                            r"oauthbearer\.config", re.IGNORECASE)


class _Shown(Mapping[str, Any]):
    """A read-only mapping whose repr shows "<redacted>" for the set values of the keys `_secret` names."""

    _values: dict[str, Any]

    def _secret(self, key: str) -> bool:
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        shown = {k: ("<redacted>" if self._secret(k) and v else v) for k, v in self._values.items()}
        return f"{type(self).__name__}({shown})"

    __str__ = __repr__


class PrefixSettings(_Shown):
    """The settings a prefix option collected (`kafka.*`: {"bootstrap.servers": ..., "linger.ms": ...}); its repr
    and `scrub` hide the values of settings whose name says they are a secret (SECRET_SETTING)."""

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:  # Any: a client's settings, of its types
        self._values = dict(values or {})

    def _secret(self, key: str) -> bool:
        return SECRET_SETTING.search(key) is not None

    def scrub(self, text: str) -> str:
        """`text` without any secret value of these settings (a client's messages may echo a setting)."""
        for key, value in self._values.items():
            if self._secret(key) and value:
                text = text.replace(str(value), "<redacted>")
        return text


class Options(_Shown):
    """Parsed, validated options. Secrets are masked in repr/str; `explicit` holds the keys the user set."""

    def __init__(self, values: dict[str, Any], explicit: frozenset[str], secrets: frozenset[str]) -> None:
        self._values = values
        self.explicit = explicit
        self._secrets = secrets

    def _secret(self, key: str) -> bool:
        return key in self._secrets

    def is_set(self, key: str) -> bool:
        return key in self.explicit

    def with_values(self, **changes: Any) -> Options:
        """A copy with some values replaced; keys are attribute names (s2_auth_token=..., see `attribute`)."""
        by_attr = {attribute(k): k for k in self._values}
        values = dict(self._values)
        for attr, value in changes.items():
            values[by_attr[attr]] = value
        return Options(values, self.explicit, self._secrets)

    def typed(self, cls: type[T], covering: Iterable[Option] = (), prefix: str = "", **extra: Any) -> T:
        """These options as the frozen dataclass `cls`, each field the option of its attribute name (without
        `prefix`: 'sink.' makes sink.batch.max-size the field batch_max_size); `extra` fills fields that are no
        option. A field that names neither, or an option of `covering` without a field, is a programming error: the
        declarations and the type stay one list."""
        by_attr = {attribute(k.removeprefix(prefix)): k for k in self._values if k.startswith(prefix)}
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]  # `cls` is a dataclass: TypedOptions' are
        unknown = sorted(names - set(by_attr) - set(extra))
        uncovered = sorted(o.name for o in covering if attribute(o.name.removeprefix(prefix)) not in names)
        if unknown or uncovered:
            raise AssertionError(f"{cls.__name__}: fields {unknown} name no option; options {uncovered} have no field")
        return cls(**{n: extra[n] if n in extra else self._values[by_attr[n]] for n in names})


class TypedOptions:
    """Base of a format's typed options: a frozen dataclass with one field per option of `declared`, built once on
    the driver from the parsed options, `of(opts)` (a data source's `write_options()` / `read_options()`, or the
    `opts` its hooks are handed). Fields that are no option come from `conn_from` (the typed connection, field
    `conn`) and `derived` (others)."""

    declared: ClassVar[tuple[Option, ...]] = ()
    prefix: ClassVar[str] = ""  # left out of the fields' names (SinkConfig: 'sink.')
    # e.g. Connection.from_options: fills `conn`. Callable[..., Any]: a classmethod assigned here is seen bound by mypy
    # (Callable[[Options], X] would refuse it); the connection's type is the format's own.
    conn_from: ClassVar[Callable[..., Any] | None] = None

    @classmethod
    def of(cls, opts: Options) -> Self:
        made = {} if cls.conn_from is None else {"conn": cls.conn_from(opts)}
        return opts.typed(cls, covering=cls.declared, prefix=cls.prefix, **made, **cls.derived(opts))

    @classmethod
    def derived(cls, opts: Options) -> dict[str, Any]:
        """The fields that are no option (or another form of one), from the parsed options; none by default."""
        return {}


Check = Callable[[Options], None]
T = TypeVar("T")


def attribute(name: str) -> str:
    """An option's name as a Python attribute: '_' for '.' and '-', snake_case for camelCase (failOnDataLoss ->
    fail_on_data_loss)."""
    name = name.removesuffix(".*")  # a prefix option: kafka.* -> kafka
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).replace(".", "_").replace("-", "_").lower()


@dataclass(frozen=True)
class OptionSpec:
    """The declared options of one format plus the checks that span several options."""

    format_name: str
    options: tuple[Option, ...]
    checks: tuple[Check, ...] = field(default=())
    # Keys Spark itself passes along with the user's options: save(path), writeStream's checkpoint, and
    # writeStream.queryName(...) (Declarative Pipelines name every flow's query so). Never the user's typo.
    passthrough: frozenset[str] = frozenset({"path", "checkpointlocation", "queryname"})

    def __post_init__(self) -> None:
        names = [o.name for o in self.options]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise AssertionError(f"options declared twice: {sorted(dupes)}")
        bad = [o.name for o in self.options if (o.kind == "prefix") != o.name.endswith(".*")]
        if bad:
            raise AssertionError(f"a prefix option is named '<prefix>.*' and only it: {bad}")

    def extend(self, options: Iterable[Option] = (), checks: Iterable[Check] = (), **defaults: Any) -> OptionSpec:
        """A spec with more options/checks; `defaults` overrides defaults by option name (dots as _)."""
        by_name = {o.name.replace(".", "_").replace("-", "_"): o for o in self.options}
        merged = []
        for opt in self.options:
            key = opt.name.replace(".", "_").replace("-", "_")
            merged.append(replace(opt, default=defaults[key]) if key in defaults else opt)
        unknown = set(defaults) - set(by_name)
        if unknown:
            raise AssertionError(f"defaults for undeclared options: {sorted(unknown)}")
        return OptionSpec(self.format_name, (*merged, *options), (*self.checks, *checks), self.passthrough)

    def renamed(self, format_name: str) -> OptionSpec:
        return replace(self, format_name=format_name)

    def get(self, name: str) -> Option:
        for opt in self.options:
            if opt.name == name:
                return opt
        raise KeyError(name)

    def parse(self, raw: Mapping[str, Any]) -> Options:
        declared = {o.name.lower(): o for o in self.options if o.kind != "prefix"}
        prefixes = {o.name[:-1].lower(): o for o in self.options if o.kind == "prefix"}  # "kafka." -> kafka.*
        values: dict[str, Any] = {o.name: o.default for o in self.options}
        collected: dict[str, dict[str, Any]] = {o.name: {} for o in prefixes.values()}
        explicit = set()
        for key, value in raw.items():
            low = key.lower()
            if low in self.passthrough:
                continue
            opt = declared.get(low)
            prefix = next((p for p in prefixes if low.startswith(p) and len(low) > len(p)), None)
            if opt is None and prefix is None:
                raise OptionError(self._unknown_message(key))
            if opt is not None:
                values[opt.name] = opt.parse(value)
                explicit.add(opt.name)
            if prefix is not None:
                collected[prefixes[prefix].name][key[len(prefix):]] = values[opt.name] if opt else str(value)
                explicit.add(prefixes[prefix].name)
        values.update({name: PrefixSettings(settings) for name, settings in collected.items()})
        missing = [o.name for o in self.options if o.required and o.name not in explicit]
        if missing:
            hint = ""
            if not raw:
                hint = (" No options reached the data source at all: if this is a table made with CREATE TABLE ... "
                        f"USING {self.format_name} OPTIONS (...), note that Spark 4.3 does not pass a table's OPTIONS "
                        f"to Python data sources; use CREATE TEMPORARY VIEW name (columns) USING {self.format_name} "
                        "OPTIONS (...) and INSERT INTO / SELECT FROM that view.")
            raise OptionError(
                f"format '{self.format_name}' needs option(s) {', '.join(missing)}: "
                f"set them with .option('{missing[0]}', ...).{hint}"
            )
        parsed = Options(values, frozenset(explicit), frozenset(o.name for o in self.options if o.secret))
        for check in self.checks:
            check(parsed)
        return parsed

    def _unknown_message(self, key: str) -> str:
        names = sorted(o.name for o in self.options)
        close = difflib.get_close_matches(key.lower(), names, n=1, cutoff=0.5)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        return (
            f"unknown option '{key}' for format '{self.format_name}'.{hint} "
            f"Valid options: {', '.join(names)}."
        )


def check_http_endpoint(option: str, url: str, example: str, credentials: str) -> str:
    """`url` without a trailing slash, once it is an http(s) URL with a host and no user, password or query
    string (secrets belong in options that are redacted); an OptionError naming `option` otherwise."""
    from urllib.parse import urlsplit

    url = url.rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OptionError(f"{option}: {url!r} is not an HTTP endpoint; write {example} or https://...")
    if parts.username or parts.password or parts.query:
        raise OptionError(f"{option} must not carry a user, password or query string: use {credentials}.")
    return url


def option_table(options: Sequence[Option]) -> str:
    """Markdown table of options, the form used in docs/options.md."""
    lines = ["| option | type | default | range | meaning |", "| --- | --- | --- | --- | --- |"]
    for opt in options:
        lines.append(
            f"| `{opt.name}` | {opt.kind} | {opt.default_text()} | {opt.range_text()} | {opt.meaning} |"
        )
    return "\n".join(lines)
