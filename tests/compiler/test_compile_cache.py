"""pjit and pmap inside jax's persistent compilation cache.

Each case runs ``compile_cache_worker.py`` in fresh processes (bounded in time)
sharing one cache directory, and reads jax.monitoring's cache events from
them: a warm process loads instead of compiling, the key covers the
partitioner choice and compiler options, and an entry that cannot be read back
is compiled again with a warning, never run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_json

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]  # starts processes

WORKER = Path(__file__).resolve().parent / "compile_cache_worker.py"


def _run(mode: str, cache_dir: Path, **settings: str) -> dict[str, Any]:
    env = {
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "JAX_PLATFORMS": "cpu",
        "JAX_COMPILATION_CACHE_DIR": str(cache_dir),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
        **settings,
    }
    return run_json([str(WORKER), mode], env)


def _entries(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.glob("*-cache"))


def test_a_warm_process_loads_pjit_and_pmap_from_the_cache(tmp_path: Path) -> None:
    cold = _run("shardy", tmp_path)
    assert cold["pjit_ok"] and cold["pmap_ok"]
    assert cold["hits"] == 0 and cold["misses"] == 2  # one pjit, one pmap entry written
    assert len(_entries(tmp_path)) == 2
    # jax.monitoring sees our lowering and compile under jax's event names.
    assert cold["backend_compile_timed"] == 2 and cold["lowering_timed"] >= 2

    warm = _run("shardy", tmp_path)
    assert warm["pjit_ok"] and warm["pmap_ok"]
    assert warm["hits"] == 2 and warm["misses"] == 0  # no XLA compilation at all

    # The key covers the partitioner choice and compiler options: no false hit.
    gspmd = _run("gspmd", tmp_path)
    assert gspmd["pjit_ok"] and gspmd["pmap_ok"]
    assert gspmd["hits"] == 0 and gspmd["misses"] == 2
    with_options = _run("gspmd+opts", tmp_path)
    assert with_options["pjit_ok"]
    assert with_options["hits"] == 1 and with_options["misses"] == 1  # pmap hits, pjit does not


def test_a_truncated_entry_is_compiled_again_with_a_warning(tmp_path: Path) -> None:
    _run("shardy", tmp_path)
    for entry in _entries(tmp_path):
        data = entry.read_bytes()
        entry.write_bytes(data[: len(data) // 2])
    again = _run("shardy", tmp_path)
    assert again["pjit_ok"] and again["pmap_ok"]  # recompiled: the right program
    assert again["hits"] == 0 and again["misses"] == 2
    assert any("Error reading persistent compilation cache entry" in w for w in again["warnings"])


def test_the_companion_settings_are_honoured(tmp_path: Path) -> None:
    for setting, value in [
        ("JAX_ENABLE_COMPILATION_CACHE", "false"),
        ("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "600"),
        ("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", str(1 << 30)),
    ]:
        out = _run("shardy", tmp_path, **{setting: value})
        assert out["pjit_ok"] and out["pmap_ok"]
        assert out["misses"] == 0 and not _entries(tmp_path), setting  # nothing written
    out = _run("shardy", tmp_path)  # the same program without them is written
    assert out["misses"] == 2 and len(_entries(tmp_path)) == 2
