"""Model keys: the paper's names, or `config:<digest>` for a model given as its config.json.

A config model is registered once, where its path is given (the command line), into the cache's
`models/` folder under its digest; every later reader (a pool's worker, an engine server the command
starts, a rerun) resolves the key from there, and the digest is checked against the stored config so a
key always means the config it was made from. The key, not the path, is the model's identity in a run
spec and a cache key: the same config at another path is the same model, an edited one another.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from retrybench.engine.model_config import UnsupportedModel, config_digest, model_from_config
from retrybench.engine.models import MODELS, ModelSpec
from retrybench.records.atomicfile import write_atomic
from retrybench.records.cache import cache_dir

__all__ = ["CONFIG_PREFIX", "is_config_model", "model_spec", "read_config", "register_model"]

CONFIG_PREFIX = "config:"


def is_config_model(key: str) -> bool:
    return key.startswith(CONFIG_PREFIX)


def _stored(digest: str) -> Path:
    return cache_dir() / "models" / f"{digest}.json"


def read_config(path: Path) -> dict[str, Any]:
    """The config.json at `path`, or in the model directory `path`; UnsupportedModel when it is neither."""
    file = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise UnsupportedModel(f"{file}: not a readable config.json ({error})") from error
    if not isinstance(config, dict):
        raise UnsupportedModel(f"{file}: a config.json is a JSON object")
    return config


def _name(config: dict[str, Any], path: Path) -> str:
    given = config.get("_name_or_path")
    return str(given) if given else str(path.resolve())


def register_model(path: Path) -> str:
    """The key of the model whose config.json is at `path` (a file or a model directory), once it is
    known to be priceable (UnsupportedModel otherwise) and stored in the cache."""
    config = read_config(path)
    model_from_config(config, _name(config, path))
    digest = config_digest(config)
    stored = _stored(digest)
    if not stored.is_file():
        stored.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(stored, json.dumps({"path": str(path.resolve()), "name": _name(config, path), "config": config},
                                        indent=1, sort_keys=True))
    return CONFIG_PREFIX + digest


def model_spec(key: str) -> ModelSpec:
    """The model a key names: a paper model's, or a registered config's; ValueError naming the known ones."""
    if key in MODELS:
        return MODELS[key]
    if not is_config_model(key):
        raise ValueError(f"unknown model {key!r}; known: {', '.join(MODELS)}, or a model directory or config.json path")
    digest = key.removeprefix(CONFIG_PREFIX)
    stored = _stored(digest)
    try:
        record = json.loads(stored.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"model {key} is not registered in {stored.parent}: give its config.json path as --model "
                         "(with the same RETRYBENCH_CACHE)") from error
    if config_digest(record["config"]) != digest:
        raise ValueError(f"{stored} holds another config than {key} (edited by hand?): remove it and give the path")
    return model_from_config(record["config"], str(record["name"]))
