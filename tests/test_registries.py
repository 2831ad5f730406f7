"""The open registries: stream purposes, event kinds, closed forms (names, clashes, determinism)."""

from __future__ import annotations

import subprocess
import sys

import attrs
import numpy as np
import pytest

from netsim.sim import streams as st
from netsim.trace import events as ev


def test_core_purposes_keep_their_codes_and_streams():
    # the spawn key of a core purpose is its historical integer code: same seed => same draws as ever
    s = st.Streams(7)
    for name, code in {"latency": 5, "noise": 11, "topology_schedule": 43, "compress": 60}.items():
        assert st.purpose_code(name) == code
        want = np.random.Generator(np.random.PCG64(np.random.SeedSequence(7, spawn_key=(code, 3)))).random(4)
        assert np.array_equal(s.rng(name, 3).random(4), want)


def test_algorithm_purposes_are_registered_by_their_modules():
    import netsim.algorithms.ldp_online  # noqa: F401
    import netsim.algorithms.pdsl  # noqa: F401

    assert st.purpose_code("shapley") == 81 and st.purpose_code("data_stream") == 71
    core = subprocess.run([sys.executable, "-c", "from netsim.sim.streams import purposes; print(sorted(purposes()))"],
                          capture_output=True, text=True, check=True).stdout
    assert "'latency'" in core and "shapley" not in core and "data_stream" not in core  # not listed in the core


def test_plugin_purpose_gets_a_stable_code_from_its_name():
    code = st.register_purpose("my_plugin_noise")
    assert code == st.name_code("my_plugin_noise") >= st.NAME_CODE_BASE
    assert st.register_purpose("my_plugin_noise") == code  # idempotent
    a = st.Streams(3).rng("my_plugin_noise", 1).random(3)
    b = np.random.Generator(np.random.PCG64(np.random.SeedSequence(3, spawn_key=(code, 1)))).random(3)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, st.Streams(3).rng("algorithm", 1).random(3))


def test_purpose_clashes_and_unknown_names_are_refused():
    with pytest.raises(ValueError, match="'latency' is already registered with code 5, not 6"):
        st.register_purpose("latency", 6)
    with pytest.raises(ValueError, match="code 5 is already used by 'latency'"):
        st.register_purpose("my_latency", 5)
    with pytest.raises(ValueError, match="identifier"):
        st.register_purpose("has space")
    with pytest.raises(KeyError, match="unknown stream purpose 'nope'.*register_purpose"):
        st.Streams(0).rng("nope")


def test_seed_sequence_is_the_streams_own():
    s = st.Streams(11)
    g = np.random.Generator(np.random.PCG64(s.seed_sequence("churn", 2)))
    assert np.array_equal(g.random(3), st.Streams(11).rng("churn", 2).random(3))


@attrs.frozen(slots=True)
class Ping(ev.EventRow):
    kind = "test_ping"
    t: float
    agent: int
    value: float


def test_event_kind_registers_writes_a_row_and_decodes():
    ev.register_event_kind(Ping)
    ev.register_event_kind(Ping)  # idempotent
    assert ev.event_kinds()["test_ping"] is Ping and "test_ping" not in ev.KINDS
    e = Ping(1.5, 2, 0.25)
    assert ev.row(e) == (1.5, "test_ping", 2, -1, -1, 0, 0.25, -1, "")
    assert ev.decode(1.5, "test_ping", agent=2, peer=-1, value=0.25, tag="") == e


def test_pdsl_shapley_kind_lives_in_pdsl_and_round_trips():
    from netsim.algorithms.pdsl import ShapleyWeight

    assert not hasattr(ev, "ShapleyWeight") and ev.event_kinds()["shapley"] is ShapleyWeight
    e = ShapleyWeight(2.0, 1, 3, 4, 0.125, 0.1, 1 / 3)
    assert ev.row(e)[-1] == "phi=0.1 hat=0.3333333333333333"
    assert ev.decode(2.0, "shapley", agent=1, peer=3, round=4, value=0.125, tag=e.tag) == e


def test_bad_event_kinds_are_refused():
    @attrs.frozen(slots=True)
    class Clash(ev.EventRow):
        kind = "send"
        t: float

    @attrs.define(slots=True)
    class Mutable(ev.EventRow):
        kind = "test_mutable"
        t: float

    @attrs.frozen(slots=True)
    class NoKind(ev.EventRow):
        t: float

    with pytest.raises(ValueError, match="'send' is already registered by netsim.trace.events.Send"):
        ev.register_event_kind(Clash)
    with pytest.raises(ValueError, match="must be frozen"):
        ev.register_event_kind(Mutable)
    with pytest.raises(ValueError, match="needs a class attribute kind"):
        ev.register_event_kind(NoKind)
    with pytest.raises(ValueError, match="derived from netsim.trace.events.EventRow"):
        ev.register_event_kind(int)
    with pytest.raises(KeyError, match="not registered"):
        ev.decode(0.0, "no_such_kind")


def test_closed_forms_are_registered_under_their_methods_names():
    from netsim.privacy import closed_forms as cf

    assert cf.names() == ["do_adp", "ldp_online", "pdsl", "privsgp_vr"]
    assert not hasattr(cf, "FORMS")
    assert cf.lookup("do_adp").paper.startswith("Huo, Liu, Ding, Johansson, Shi")
    for old, new in cf.DEPRECATED.items():
        assert cf.lookup(old) is cf.lookup(new)
        authors = cf.lookup(new).paper.split(' "')[0].rstrip(",")
        assert cf.deprecation_note(old) == (f"privacy.closed_form = {old!r} is an old name of {new!r} "
                                            f"({authors}); write {new!r}")
    assert cf.deprecation_note("do_adp") is None
    with pytest.raises(ValueError, match="already registered"):
        cf.register_closed_form("do_adp", "someone")(lambda releases, spec, delta: {})
    with pytest.raises(ValueError, match="other than 'none'"):
        cf.register_closed_form("seed003", "someone")


def test_an_old_closed_form_name_runs_with_a_one_line_note(tmp_path):
    from typer.testing import CliRunner

    from netsim.cli import app

    f = tmp_path / "old.toml"
    text = open("scenarios/privacy_activation.toml").read()
    assert 'closed_form = "do_adp"' in text
    f.write_text(text.replace('closed_form = "do_adp"', 'closed_form = "seed003"'))
    r = CliRunner().invoke(app, ["validate", str(f)])
    assert r.exit_code == 0, r.output
    notes = [line for line in r.output.splitlines() if line.startswith("note:")]
    assert notes == [f"note: {f}: privacy.closed_form = 'seed003' is an old name of 'do_adp' (Huo, Liu, Ding, "
                     "Johansson, Shi); "
                     "write 'do_adp'"]


def test_accountants_are_registered_by_name():
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    from netsim.privacy import accountants as acc
    from netsim.privacy.mechanisms import PrivacyError

    assert list(acc.ACCOUNTANTS)[:2] == ["rdp", "pld"]
    assert isinstance(acc.make_accountant("rdp"), RdpAccountant)
    with pytest.raises(PrivacyError, match="accountant must be one of rdp, pld.*got 'nope'"):
        acc.make_accountant("nope")
    with pytest.raises(ValueError, match="'rdp' is already registered"):
        acc.register_accountant("rdp", dp_accounting.pld.PLDAccountant)

    class Counting(RdpAccountant):  # RDP, under another name: the same numbers through the generic path
        pass

    acc.register_accountant("test_rdp_copy", Counting, "RDP again")
    try:
        rel = [ev.Release(float(t), 0, -1, t, 10, "gaussian", "gradient", 1.5, 1.0, q=0.1) for t in range(40)]
        got = acc.epsilon(rel, 1e-5, "test_rdp_copy")
        assert got == pytest.approx(acc.epsilon(rel, 1e-5, "rdp"), rel=1e-12) and 0 < got < 10
    finally:
        del acc.ACCOUNTANTS["test_rdp_copy"], acc.ACCOUNTANT_DOCS["test_rdp_copy"]


def test_algorithm_names_follow_the_registries_one_clash_rule(tmp_path):
    """A plugin that registers a built-in's name is refused in one line naming its own line (it used to be
    silently replaced by the built-in); the same registration twice is a no-op."""
    import subprocess
    import sys
    from pathlib import Path

    from netsim.algorithms import registry
    from netsim.algorithms.dpsgd import DPSGD, DPSGDParams

    registry.names()
    before = registry.REGISTRY["dpsgd"]
    registry.register("dpsgd", DPSGDParams)(DPSGD)  # the module imported again: nothing changes
    assert registry.REGISTRY["dpsgd"] is before
    with pytest.raises(ValueError, match="algorithm 'dpsgd' is already registered"):
        registry.register("dpsgd", DPSGDParams)(lambda agent, p: iter(()))
    assert registry.REGISTRY["dpsgd"] is before
    plugin = tmp_path / "mine.py"
    plugin.write_text("from netsim.algorithms.dpsgd import DPSGDParams\nfrom netsim.algorithms.registry import "
                      "register\n\n\n@register('dpsgd', DPSGDParams)\ndef mine(agent, p):\n    yield agent.wake()\n")
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-m", "netsim", "validate", "scenarios/quickstart.toml", "--plugin", plugin],
                       cwd=root, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert f"{plugin}:5: ValueError: algorithm 'dpsgd' is already registered" in r.stdout + r.stderr
