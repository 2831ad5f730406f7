"""An algorithm's checks run while the run is prepared, before anything is written: a bad setting leaves
no run folder and prints one line naming the scenario file and key (exit 2)."""

from __future__ import annotations

import subprocess

import pytest

import netsim
from netsim.errors import InputError
from tests.conftest import cli_env, netsim_cli

SCENARIO = """\
name = "bad"

[run]
seed = 1
until = 5.0

[agents]
count = 6
compute_time = {{ kind = "constant", value = 0.01 }}
activation = {activation}

[topology]
kind = "{topology}"

[data]
kind = "synthetic"
samples = 300
features = 4

[algorithm]
{algorithm}
"""

CASES = {
    # a program function that checks before it returns the program (calibration, roles, activation)
    "do_adp_poisson": ('{ kind = "poisson", rate = 1.0 }', "ring", 'name = "do_adp"\nsigma = 0.1',
                       "agents.activation.kind", "do_adp runs in rounds"),
    "adpsgd_bipartite": ('{ kind = "periodic", period = 1.0 }', "complete", 'name = "adpsgd"\nroles = "bipartite"',
                         "algorithm.roles", "bipartite"),
    "privsgp_constants": ('{ kind = "periodic", period = 1.0 }', "ring",
                          'name = "privsgp_vr"\niterations = 0\nepsilon = 1.0', "algorithm.L", "K = K*"),
}


def write(tmp_path, case: str):
    act, topo, alg, *_ = CASES[case]
    path = tmp_path / f"{case}.toml"
    path.write_text(SCENARIO.format(activation=act, topology=topo, algorithm=alg))
    return path


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_setting_leaves_no_folder_and_names_file_and_key(tmp_path, case):
    path = write(tmp_path, case)
    out = tmp_path / "run"
    res = subprocess.run(netsim_cli("run", str(path), "--out", str(out), "-q"), capture_output=True, text=True,
                         env=cli_env(), timeout=120)
    key, words = CASES[case][3], CASES[case][4]
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr
    assert lines[0].startswith(f"error: {path}: {key}: ") and words in lines[0]
    assert not out.exists()


def test_python_api_raises_before_the_folder_exists(tmp_path):
    path = write(tmp_path, "do_adp_poisson")
    out = tmp_path / "run"
    with pytest.raises(InputError) as e:
        netsim.run(path, out=out)
    assert e.value.key == "agents.activation.kind" and str(path) in str(e.value)
    assert not out.exists()
