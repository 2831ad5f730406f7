"""The same sweep on a local Ray instance (2 CPUs) gives the local runs' results, byte for byte
(in-process runs equal the process pool's: tests/test_sweep.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from netsim.sweep import load_sweep, run_sweep

from .test_sweep import GRID, write_sweep

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_sweep_equals_the_process_pool(tmp_path, local_ray):
    p = write_sweep(tmp_path, GRID)
    pool = run_sweep(p, jobs=1, out=tmp_path / "pool")
    on_ray = run_sweep(p, ray="local", out=tmp_path / "ray")
    assert pool.ran == on_ray.ran == 4
    assert pool.table.equals(on_ray.table)
    for t in load_sweep(p, tmp_path / "pool").tasks:
        rel = Path(t.folder).relative_to(tmp_path / "pool")
        a, b = tmp_path / "pool" / rel, tmp_path / "ray" / rel
        assert sorted(x.name for x in a.iterdir()) == sorted(x.name for x in b.iterdir())
        for name in ("trace.arrows", "metrics.csv", "scenario.toml"):
            assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert run_sweep(p, ray="local", out=tmp_path / "ray").ran == 0  # resumes like the pool


def test_missing_ray_is_a_clear_error(monkeypatch):
    import sys

    from netsim.errors import InputError
    from netsim.sweep_ray import _import_ray

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(InputError, match=r"install netsim\[ray\]"):
        _import_ray()


@pytest.mark.parametrize("address, needle", [("nowhere", "expected local, auto, HOST:PORT"),
                                             ("127.0.0.1:1", "no Ray cluster answers at '127.0.0.1:1'")])
def test_bad_ray_address_is_one_line_exit_2(tmp_path, monkeypatch, address, needle):
    from typer.testing import CliRunner

    from netsim.cli import app

    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # as in a fresh `netsim sweep` process
    res = CliRunner().invoke(app, ["sweep", str(write_sweep(tmp_path, GRID)), "-q", "--ray", address])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1 and needle in res.output


def test_bare_ray_flag_means_a_local_instance():
    from netsim.cli import _bare_ray

    assert _bare_ray(["sweep", "s.toml", "--ray"]) == ["sweep", "s.toml", "--ray", "local"]
    assert _bare_ray(["sweep", "s.toml", "--ray", "-q"]) == ["sweep", "s.toml", "--ray", "local", "-q"]
    assert _bare_ray(["sweep", "s.toml", "--ray", "auto"]) == ["sweep", "s.toml", "--ray", "auto"]
