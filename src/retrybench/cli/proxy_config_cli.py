"""`retrybench proxy --config FILE`: the command's flags as configuration keys, layered (proxy/proxy_config.py).

The flags' own click types check every value from the file and the environment, so a value is refused
for the same reasons wherever it was set, and the message names its key and its file or variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from retrybench.proxy.proxy_config import ConfigError, Value, env_layer, file_layer, merge, to_toml

__all__ = ["CONFIG_PARAMS", "config_key", "configured", "effective_toml"]

CONFIG_PARAMS = ("config_path", "print_config")  # the flags about the configuration itself: no keys
COMMAND_LINE = "the command line"


def config_key(param: click.Parameter) -> str:
    """A flag's key: its long name without the dashes, with underscores (--drain-timeout: drain_timeout)."""
    longest = max((o for o in param.opts if o.startswith("--")), key=len)
    return longest.lstrip("-").replace("-", "_")


def _keyed(ctx: click.Context) -> dict[str, click.Parameter]:
    return {config_key(p): p for p in ctx.command.params if p.name not in CONFIG_PARAMS and p.name is not None}


def configured(ctx: click.Context, config_path: Path | None,
               environ: Mapping[str, str] | None = None) -> tuple[dict[str, Any], dict[str, Value]]:
    """(each parameter's value by its name, the values set by a layer by key): the command's defaults,
    overridden by the file, then the environment, then the flags given."""
    params = _keyed(ctx)
    layers = []
    if config_path is not None:
        try:
            text = config_path.read_text(encoding="utf-8")
        except OSError as error:
            raise click.UsageError(f"--config {config_path}: {error.strerror or error}") from error
        layers.append(file_layer(text, str(config_path), params))
    layers.append(env_layer(os.environ if environ is None else environ, params))
    flags = {key: Value(ctx.params[p.name], COMMAND_LINE) for key, p in params.items()
             if p.name is not None and ctx.get_parameter_source(p.name) is ParameterSource.COMMANDLINE}
    merged = merge(*layers, flags)
    values = {p.name: ctx.params[p.name] for p in params.values() if p.name is not None}
    for key, given in merged.items():
        param = params[key]
        assert param.name is not None
        values[param.name] = given.value if given.origin == COMMAND_LINE else _convert(ctx, param, key, given)
    return values, merged


def _convert(ctx: click.Context, param: click.Parameter, key: str, given: Value) -> Any:
    """A value from the file or the environment, checked and converted as the flag's own would be."""
    value = given.value
    if isinstance(value, dict):  # the policy inline; checked field by field when it is built
        return value
    items = value if isinstance(value, list) else [value]
    if param.multiple and not isinstance(value, list):
        items = [value]
    converted = []
    for item in items:
        if isinstance(item, bool) or (isinstance(item, float) and _integral(param)):
            raise ConfigError(f"{given.origin}: key {key!r}: {item!r} is not {_kind(param)}")
        try:
            converted.append(param.type.convert(item, param, ctx))
        except click.BadParameter as error:
            raise ConfigError(f"{given.origin}: key {key!r}: {error.message}") from error
    return tuple(converted) if param.multiple else converted[0]


def _integral(param: click.Parameter) -> bool:
    return isinstance(param.type, click.IntRange) or param.type is click.INT


def _kind(param: click.Parameter) -> str:
    if _integral(param):
        return "an integer"
    return "a number" if isinstance(param.type, click.FloatRange) or param.type is click.FLOAT else "a string"


def effective_toml(ctx: click.Context, values: Mapping[str, Any], policy: Mapping[str, Any]) -> str:
    """The configuration the proxy runs with, as a file `--config` reads back; the condition as the
    table of the policy it gives (`policy`: its fields), a named one named in a comment."""
    shown: dict[str, Any] = {}
    named = ""
    for key, param in _keyed(ctx).items():
        value = values[param.name] if param.name is not None else None
        if key == "condition":
            named = "" if isinstance(value, dict) else f"# condition {value!r}, as the table below\n"
            value = dict(policy)
        elif isinstance(value, tuple):
            value = [str(v) for v in value]
        elif isinstance(value, Path):
            value = str(value)
        shown[key] = value
    return named + to_toml(shown)
