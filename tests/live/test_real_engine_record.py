"""The real-engine comparison's record types (realvllm/record.py) against the record it wrote to the docs.

pydantic validates docs/real-vllm/real-engine.json against `RealEngineRecord` in strict mode, then writes
it back: a key the types do not declare would be dropped, a missing one or a value of another type
refused, so the round trip gives the file back only where the types describe it whole.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from retrybench.realvllm.compare_real import FORMAT, CompareSettings
from retrybench.realvllm.record import RealEngineRecord, SettingsJson

RECORD = Path(__file__).resolve().parents[2] / "docs" / "real-vllm" / "real-engine.json"


def keys_in_order(value: Any) -> Any:
    """Every object's keys in their order, nested as the value is: equal values may order them differently."""
    if isinstance(value, dict):
        return [(key, keys_in_order(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [keys_in_order(item) for item in value]
    return None


def test_the_recorded_comparison_round_trips_through_its_types() -> None:
    text = RECORD.read_text()
    written = json.loads(text)
    assert written["format"] == FORMAT
    adapter = TypeAdapter(RealEngineRecord)
    typed = adapter.validate_json(text, strict=True)
    back = adapter.dump_python(typed, mode="json")
    assert back == written
    assert keys_in_order(back) == keys_in_order(written), "the types list the keys in another order than the file"


def test_a_record_missing_a_key_or_holding_another_type_is_refused() -> None:
    written = json.loads(RECORD.read_text())
    adapter = TypeAdapter(RealEngineRecord)
    del written["conditions"][0]["live"]["recovered"]
    broken = json.dumps(written)
    try:
        adapter.validate_json(broken, strict=True)
    except ValueError as error:
        assert "recovered" in str(error)
    else:
        raise AssertionError("a condition without its live recovery passed as a RealEngineRecord")
    written = json.loads(RECORD.read_text())
    written["band"]["spread"] = "4.9%"
    try:
        adapter.validate_json(json.dumps(written), strict=True)
    except ValueError as error:
        assert "spread" in str(error)
    else:
        raise AssertionError("a band with a text spread passed as a RealEngineRecord")


def test_the_settings_hold_every_setting_but_the_log_callback() -> None:
    assert list(SettingsJson.__annotations__) == [f.name for f in fields(CompareSettings) if f.name != "log"]
