"""Client profiles: retry policies of real clients (the paper's, the official SDKs', a typical tenacity
wrapper) as ClientPolicy values, one TOML file each in clients/, so that any proxy condition can be
run with any client. Each file says where its rules were read (`source`)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from retrybench.conditions.client_stack import StackLayer, layers_from_tables
from retrybench.conditions.config import ClientPolicy, ConfigError, _build

__all__ = ["PAPER_CLIENT", "ClientProfile", "available_client_profiles", "client_profile", "client_stack",
           "load_client_profile"]

PAPER_CLIENT = "paper"
_TOP_KEYS = ("client", "description", "layer", "source")


@dataclass(frozen=True, kw_only=True)
class ClientProfile:
    """One profile: its name, what it models, where its rules come from, and the policy. A stacked
    profile (`[[layer]]` tables, conditions/client_stack.py) has its layers, outermost first, and its
    outermost layer's policy as `policy`."""

    name: str
    description: str
    source: str
    policy: ClientPolicy
    layers: tuple[StackLayer, ...] = ()


def _profile_dir() -> Path:
    return Path(str(resources.files("retrybench.conditions") / "clients"))


def available_client_profiles() -> list[str]:
    """The names of the profiles shipped in clients/."""
    return sorted(p.stem for p in _profile_dir().glob("*.toml"))


def _text(data: dict[str, Any], key: str, where: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: {key!r} must be a non-empty string")
    return value


def _policy(table: Any, where: str, section: str = "[client]") -> ClientPolicy:
    """The [client] table (or a layer's) as a ClientPolicy; retry_on is a TOML array of outcomes, the policy's a
    string."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: {section} must be a table")
    table = dict(table)
    retry_on = table.get("retry_on")
    if retry_on is not None:
        if not isinstance(retry_on, list) or not all(isinstance(o, str) and "," not in o for o in retry_on):
            raise ConfigError(f"{where} {section}: field 'retry_on' must be an array of outcomes, got {retry_on!r}")
        table["retry_on"] = ",".join(retry_on)
    return _build(ClientPolicy, table, f"{where} {section}")


def profile_from_toml(text: str, name: str, where: str = "<client profile>") -> ClientProfile:
    """Parse one clients/*.toml file; every error names the file and the field."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{where}: not valid TOML: {error}") from error
    for key in data:
        if key not in _TOP_KEYS:
            raise ConfigError(f"{where}: unknown key {key!r}; allowed: {', '.join(_TOP_KEYS)}")
    if "layer" in data:
        if "client" in data:
            raise ConfigError(f"{where}: give either [client] or [[layer]] tables, not both")
        layers = layers_from_tables(data["layer"], where, _policy)
        return ClientProfile(name=name, description=_text(data, "description", where),
                             source=_text(data, "source", where), policy=layers[0].policy, layers=layers)
    return ClientProfile(name=name, description=_text(data, "description", where), source=_text(data, "source", where),
                         policy=_policy(data.get("client", {}), where))


def client_profile(name_or_path: str) -> ClientProfile:
    """A profile by its name (a file in clients/) or by the path of a TOML file."""
    path = Path(name_or_path)
    if path.suffix == ".toml" and path.exists():
        return profile_from_toml(path.read_text(), path.stem, str(path))
    candidate = _profile_dir() / f"{name_or_path}.toml"
    if "/" in name_or_path or not candidate.exists():
        raise ConfigError(f"unknown client profile {name_or_path!r}; known: "
                          f"{', '.join(available_client_profiles())} (or give the path of a .toml file)")
    return profile_from_toml(candidate.read_text(), name_or_path, f"clients/{candidate.name}")


def client_stack(name_or_path: str) -> tuple[StackLayer, ...] | None:
    """The layers of a stacked profile, outermost first; None for a one-policy ([client]) profile."""
    return client_profile(name_or_path).layers or None


def load_client_profile(name_or_path: str) -> ClientPolicy:
    """The client policy of a profile (see client_profile)."""
    return client_profile(name_or_path).policy
