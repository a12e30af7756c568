"""`retrybench proxy --config`: one file, environment variables over it, flags over both.

The layers' logic (proxy/proxy_config.py) on its own, then the command: the documented example loads,
every flag has a key, the precedence holds, `--print-config` prints what `--config` reads back, and a
bad key or value is refused naming the key and the file (or the variable).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from retrybench.cli.live import proxy
from retrybench.cli.main import main
from retrybench.cli.proxy_config_cli import CONFIG_PARAMS, config_key
from retrybench.proxy.proxy_config import ConfigError, Value, env_layer, file_layer, merge, to_toml

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "proxy.toml"
KEYS = ("engine", "port", "condition", "drain_timeout")


# -- the layers ------------------------------------------------------------------------------------


def test_a_file_with_an_unknown_key_is_refused_naming_the_key_and_the_file() -> None:
    with pytest.raises(ConfigError, match=r"^site\.toml: unknown key 'prot'"):
        file_layer("prot = 8000\n", "site.toml", KEYS)
    with pytest.raises(ConfigError, match=r"^site\.toml: key 'port' must be a value, not a table"):
        file_layer("[port]\nx = 1\n", "site.toml", KEYS)
    with pytest.raises(ConfigError, match=r"^site\.toml: not valid TOML"):
        file_layer("port = = 1\n", "site.toml", KEYS)


def test_environment_variables_name_keys_and_lists_are_comma_separated() -> None:
    layer = env_layer({"RETRYBENCH_PROXY_ENGINE": "http://a:1, http://b:2", "RETRYBENCH_PROXY_PORT": "9000",
                       "HOME": "/root"}, KEYS)
    assert layer == {"engine": Value(["http://a:1", "http://b:2"], "environment variable RETRYBENCH_PROXY_ENGINE"),
                     "port": Value("9000", "environment variable RETRYBENCH_PROXY_PORT")}
    with pytest.raises(ConfigError, match="RETRYBENCH_PROXY_PROT: names no key"):
        env_layer({"RETRYBENCH_PROXY_PROT": "1"}, KEYS)


def test_a_later_layer_overrides_an_earlier_one_key_by_key() -> None:
    merged = merge({"port": Value(1, "f"), "engine": Value(["x"], "f")}, {"port": Value("2", "env")})
    assert merged == {"port": Value("2", "env"), "engine": Value(["x"], "f")}


def test_to_toml_reads_back_as_it_was_written() -> None:
    values = {"engine": ["http://a:1"], "port": 8000, "log": None, "time_scale": 0.001, "host": 'a"b',
              "condition": {"coalescing": True, "max_outstanding": None, "retain_s": 60.0}}
    read = tomllib.loads(to_toml(values))
    assert read == {"engine": ["http://a:1"], "port": 8000, "time_scale": 0.001, "host": 'a"b',
                    "condition": {"coalescing": True, "retain_s": 60.0}}


# -- the command -----------------------------------------------------------------------------------


def printed(*args: str, env: dict[str, str] | None = None) -> dict[str, object]:
    result = CliRunner().invoke(main, ["proxy", *args, "--print-config"], env=env)
    assert result.exit_code == 0, result.output
    config: dict[str, object] = tomllib.loads(result.output)
    return config


def refused(*args: str, env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(main, ["proxy", *args, "--print-config"], env=env)
    assert result.exit_code == 2, result.output
    return result.output


def test_the_documented_example_loads() -> None:
    config = printed("--config", str(EXAMPLE))
    written = tomllib.loads(EXAMPLE.read_text())
    assert {k: v for k, v in config.items() if k in written and k != "condition"} == \
        {k: v for k, v in written.items() if k != "condition"}
    policy = config["condition"]
    assert isinstance(policy, dict)
    assert {k: policy[k] for k in written["condition"]} == written["condition"]


def test_every_flag_has_a_key() -> None:
    keys = {config_key(p) for p in proxy.params if p.name not in CONFIG_PARAMS}
    assert len(keys) == len([p for p in proxy.params if p.name not in CONFIG_PARAMS])
    assert "drain_timeout" in keys and "engine" in keys and "condition" in keys
    printed_keys = set(printed("--engine", "http://a:1", "--retain-s", "1", "--retain-max-bytes", "2",
                               "--log", "x.jsonl", "--engine", "http://b:2", "--route", "key-affine"))
    assert printed_keys == keys, keys ^ printed_keys


def test_environment_overrides_the_file_and_flags_override_both(tmp_path: Path) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text('engine = "http://a:1"\nport = 9000\ndrain_timeout = 12\nhost = "0.0.0.0"\n')
    env = {"RETRYBENCH_PROXY_PORT": "9100", "RETRYBENCH_PROXY_DRAIN_TIMEOUT": "7.5"}
    config = printed("--config", str(path), "--drain-timeout", "3", env=env)
    assert (config["engine"], config["host"], config["port"], config["drain_timeout"]) == \
        (["http://a:1"], "0.0.0.0", 9100, 3.0)


def test_the_condition_by_name_or_inline_gives_the_same_policy(tmp_path: Path) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text('engine = "http://a:1"\n[condition]\ncancellation = "off"\ncoalescing = true\n')
    assert printed("--config", str(path)) == printed("--engine", "http://a:1", "--condition", "coalescing")


def test_print_config_prints_what_config_reads_back(tmp_path: Path) -> None:
    first = CliRunner().invoke(main, ["proxy", "--config", str(EXAMPLE), "--port", "0", "--print-config"])
    assert first.exit_code == 0, first.output
    path = tmp_path / "printed.toml"
    path.write_text(first.output)
    again = CliRunner().invoke(main, ["proxy", "--config", str(path), "--print-config"])
    assert again.output == first.output


@pytest.mark.parametrize(("text", "message"), [
    ('engine = "http://a:1"\nport = 70000\n', "key 'port': 70000 is not in the range 0<=x<=65535"),
    ('engine = "http://a:1"\nport = "eighty"\n', "key 'port': 'eighty' is not a valid integer"),
    ('engine = "http://a:1"\nport = 80.5\n', "key 'port': 80.5 is not an integer"),
    ('engine = "http://a:1"\ndrain_timeout = -1\n', "key 'drain_timeout': -1.0 is not in the range x>=0"),
    ('engine = "http://a:1"\ncolour = 1\n', "unknown key 'colour'"),
    ('engine = "http://a:1"\nhost = true\n', "key 'host': True is not a string"),
    ('engine = "http://a:1"\n[condition]\ncoalesing = true\n', "condition: unknown field 'coalesing'"),
    ('engine = "http://a:1"\ncondition = "no-such-condition"\n', "unknown condition 'no-such-condition'"),
])
def test_a_bad_key_or_value_is_refused_at_start_naming_it(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text(text)
    output = refused("--config", str(path))
    assert message in output, output
    if "condition '" not in message:
        assert str(path) in output.replace("\n", ""), output


def test_a_bad_environment_value_is_refused_naming_the_variable() -> None:
    output = refused("--engine", "http://a:1", env={"RETRYBENCH_PROXY_MAX_EXECUTIONS": "0"})
    assert "environment variable RETRYBENCH_PROXY_MAX_EXECUTIONS: key 'max_executions'" in output, output


def test_without_an_engine_anywhere_the_proxy_is_refused() -> None:
    assert "no engine" in refused()
