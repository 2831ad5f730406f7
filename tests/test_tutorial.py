"""docs/tutorial.md runs as written: its files are written and every `netsim` command of its bash blocks
runs (in-process, in a folder holding the repository's scenarios, as the repository root would) and exits 0,
writing nothing outside the tutorial's own scratch/ folder."""

from __future__ import annotations

import json
import re
import shlex
import shutil

from typer.testing import CliRunner

from netsim.cli import app
from tests.conftest import ROOT

TUTORIAL = ROOT / "docs" / "tutorial.md"
BLOCK = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.S | re.M)


def steps() -> list[tuple[str, str]]:
    """("file", name + text) or ("command", argv line) in the page's order."""
    out = []
    for lang, info, body in BLOCK.findall(TUTORIAL.read_text()):
        m = re.search(r"file=(\S+)", info)
        if m:
            out.append(("file", (m.group(1), body)))
        elif lang == "bash":
            out += [("command", line.strip()) for line in body.splitlines() if line.strip().startswith("netsim ")]
    return out


def test_the_tutorial_has_every_part():
    kinds = [k for k, _ in steps()]
    commands = " ".join(c for k, c in steps() if k == "command")
    assert kinds.count("file") == 6 and kinds.count("command") >= 14
    for part in ("netsim run ", "netsim keys", "netsim algorithms my_sgd --plugin", "netsim sweep ",
                 "netsim privacy ", "netsim compare ", "netsim models my_net --plugin scratch/my_model.py",
                 "--plugin scratch/my_model.py --plugin scratch/my_data.py"):
        assert part in commands, part
    assert all(item[0].startswith("scratch/") for k, item in steps() if k == "file")  # nothing in the root


def test_every_tutorial_command_runs(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for kind, item in steps():
        if kind == "file":
            name, text = item
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text(text)
            continue
        argv = shlex.split(item)[1:]
        res = runner.invoke(app, argv)
        assert res.exit_code == 0, f"{item}\n{res.output}\n{res.exception!r}"
        assert "Traceback" not in res.output
    scratch = tmp_path / "scratch"
    assert (scratch / "quick" / "agent_metrics.csv").is_file()
    gossip, triggered = (json.loads((scratch / f / "summary.json").read_text()) for f in ("gossip", "triggered"))
    assert gossip["engine"] == "windowed" and "windowed_refused" not in gossip  # an exponential latency: fast
    assert triggered["engine"] == "events" and " — remove network.bandwidth" in triggered["windowed_refused"]
    assert f"```text\n{triggered['windowed_refused']}\n```" in TUTORIAL.read_text()  # the page shows the run's line
    assert (scratch / "compare.png").is_file() and (scratch / "dp" / "privacy.json").is_file()
    assert len(list((scratch / "sweep").rglob("summary.json"))) == 4
    stations = (scratch / "stations" / "scenario.toml").read_text()
    assert 'kind = "stations"' in stations and "width = 8" in stations and 'partition = "groups"' in stations
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scenarios", "scratch"]  # nothing in the root
