"""The proxy's configuration as layers: a TOML file, `RETRYBENCH_PROXY_<KEY>` environment variables and
command-line flags, each overriding the one before (pure: no files are read, no flags parsed here).

A deployment keeps one file under version control and changes a value per environment (a port, a log
path) without editing it. Every flag of `retrybench proxy` has a key: its name without the dashes,
with underscores (`--drain-timeout` is `drain_timeout`, `RETRYBENCH_PROXY_DRAIN_TIMEOUT`). Each value
remembers where it came from (`Value.origin`), so that a bad one is refused naming its key and its file
or variable. The command line checks each value as it checks the same flag (cli/proxy_config_cli.py).
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ENV_PREFIX", "ConfigError", "Value", "env_layer", "file_layer", "merge", "to_toml"]

ENV_PREFIX = "RETRYBENCH_PROXY_"
TABLE_KEYS = frozenset({"condition"})  # keys whose value may be a table (the policy inline)
LIST_KEYS = frozenset({"engine"})  # keys that take several values (a list; comma-separated in a variable)


class ConfigError(ValueError):
    """A configuration the proxy refuses: the message names the key and where it came from."""


@dataclass(frozen=True)
class Value:
    value: Any
    origin: str  # the file, the variable or "the command line": where the value was set


def file_layer(text: str, source: str, keys: Collection[str]) -> dict[str, Value]:
    """The values a TOML file sets; an unknown key, or a table where a value belongs, is refused."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{source}: not valid TOML: {error}") from error
    layer: dict[str, Value] = {}
    for key, value in data.items():
        if key not in keys:
            raise ConfigError(f"{source}: unknown key {key!r}; known: {', '.join(sorted(keys))}")
        if isinstance(value, dict) and key not in TABLE_KEYS:
            raise ConfigError(f"{source}: key {key!r} must be a value, not a table")
        if isinstance(value, list) and key not in LIST_KEYS:
            raise ConfigError(f"{source}: key {key!r} must be one value, not a list")
        layer[key] = Value(value, source)
    return layer


def env_layer(environ: Mapping[str, str], keys: Collection[str]) -> dict[str, Value]:
    """The values `RETRYBENCH_PROXY_<KEY>` variables set (as strings; a list key's comma-separated);
    a variable with the prefix that names no key is refused, as a misspelling would go unnoticed."""
    layer: dict[str, Value] = {}
    for name, text in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        key = name[len(ENV_PREFIX):].lower()
        if key not in keys:
            known = ", ".join(ENV_PREFIX + k.upper() for k in sorted(keys))
            raise ConfigError(f"environment variable {name}: names no key; known: {known}")
        value: Any = [part.strip() for part in text.split(",") if part.strip()] if key in LIST_KEYS else text
        layer[key] = Value(value, f"environment variable {name}")
    return layer


def merge(*layers: Mapping[str, Value]) -> dict[str, Value]:
    """Each key's value from the last layer that sets it."""
    merged: dict[str, Value] = {}
    for layer in layers:
        merged.update(layer)
    return merged


def to_toml(values: Mapping[str, Any]) -> str:
    """`values` as a TOML file `file_layer` reads back: keys in order, a None left out (TOML has no
    null: an absent key keeps its default), a table key last as its own table."""
    lines: list[str] = []
    tables: list[str] = []
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, dict):
            tables += ["", f"[{key}]", *(f"{k} = {_scalar(v)}" for k, v in value.items() if v is not None)]
        elif isinstance(value, (list, tuple)):
            lines.append(f"{key} = [{', '.join(_scalar(v) for v in value)}]")
        else:
            lines.append(f"{key} = {_scalar(value)}")
    return "\n".join(lines + tables) + "\n"


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML's
