"""``compute.mixing.mix_rows`` a block of rows at a time (big models at many agents) against the whole-tensor
arithmetic and against each row's own: bit for bit, for every form of a group's models, consecutive sources (read
in place) or not, a block's separate rows stacked or added one by one, rows in any arrival order, steps on some
rows; and the spare results it reuses."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import netsim.compute.mixing as mixing


def per_row(own, keep, groups, steps, n):
    """Row k's arithmetic alone: own * keep, each slot's add in order, then each step (Agent.mix, then a step)."""
    out = []
    for k in range(n):
        r = own[k] * float(keep[k])
        for slot in groups:
            for w, ks, t, at in slot:
                if k in ks:
                    r.add_(t[at[ks.index(k)]], alpha=w)
        for lr, (ks, g) in steps.items():
            if k in ks:
                r = r - lr * g[ks.index(k)]
        out.append(r)
    return torch.stack(out)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_blocks_give_the_bits_of_the_whole_tensor_and_of_each_row(data):
    n = data.draw(st.integers(1, 23))
    p = data.draw(st.sampled_from([1, 5, 33]))
    dtype = data.draw(st.sampled_from([torch.float32, torch.float64]))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 16)))
    own = torch.randn(n, p, generator=g, dtype=dtype)
    sent = torch.randn(n + 3, p, generator=g, dtype=dtype)
    keep = torch.rand(n, generator=g, dtype=torch.float64)
    weights = [1 / 3, 0.25, 0.1 / 7]
    groups, plain = [], []
    for _ in range(data.draw(st.integers(0, 3))):
        rows = data.draw(st.permutations(range(n)))[:data.draw(st.integers(1, n))]
        slot, plain_slot, at = [], [], 0
        for w in weights[:data.draw(st.integers(1, 3))]:
            ks = sorted(rows[at:at + data.draw(st.integers(0, n))])  # ascending, as every caller forms them
            at += len(ks)
            if not ks:
                continue
            if data.draw(st.booleans()):  # consecutive senders: read in place
                lo = data.draw(st.integers(0, n + 3 - len(ks)))
                src = list(range(lo, lo + len(ks)))
            else:
                src = [data.draw(st.integers(0, n + 2)) for _ in ks]
            form = data.draw(st.sampled_from(["tuple", "list", "callable"]))
            idx = torch.tensor(src, dtype=torch.long)
            xs = ((sent, idx) if form == "tuple" else [sent[s] for s in src] if form == "list"
                  else (lambda idx=idx: sent.index_select(0, idx)))
            ks_form = torch.tensor(ks) if data.draw(st.booleans()) else list(ks)
            slot.append((w, ks_form, xs))
            plain_slot.append((w, list(ks), sent, src))
        groups.append(slot)
        plain.append(plain_slot)
    steps = {}
    if data.draw(st.booleans()):
        ks = sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1)))
        steps[0.05] = (ks, torch.randn(len(ks), p, generator=g, dtype=dtype))
    whole = mixing.mix_rows(own, keep, groups, steps, dtype)  # one block (the default block at these sizes)
    assert torch.equal(whole, per_row(own, keep, plain, steps, n))
    block = data.draw(st.integers(1, n)) * p * own.element_size()
    stack = data.draw(st.booleans())  # a block's list of rows stacked (small rows) or added row by row (big ones)
    old = mixing.BLOCK_BYTES, mixing.STACK_ROW_BYTES
    mixing.BLOCK_BYTES, mixing.STACK_ROW_BYTES = block, (old[1] if stack else 0)
    try:
        blocks = mixing.mix_rows(own, keep, groups, steps, dtype)
    finally:
        mixing.BLOCK_BYTES, mixing.STACK_ROW_BYTES = old
    assert torch.equal(blocks, whole)


def test_a_spare_result_is_reused_only_when_nothing_holds_it(monkeypatch):
    monkeypatch.setattr(mixing, "POOLED_BYTES", 0)
    monkeypatch.setattr(mixing, "_SPARE", [])
    like = torch.zeros(4, 3)
    a = mixing._result(like, torch.float32)
    b = mixing._result(like, torch.float32)
    assert b is not a  # a is still held (this name)
    view = a[1]
    del a
    c = mixing._result(like, torch.float32)
    assert c is not b and all(c is not t for t in mixing._SPARE[:2])  # a's storage read by a view; b held
    del view, b
    assert mixing._result(like, torch.float32) is mixing._SPARE[0]  # a, free now
    assert mixing._result(torch.zeros(5, 3), torch.float32).shape == (5, 3)  # another shape: a new one
    assert len(mixing._SPARE) == mixing._SPARES


def test_mixing_a_big_fleet_reuses_its_results(monkeypatch):
    monkeypatch.setattr(mixing, "POOLED_BYTES", 0)
    monkeypatch.setattr(mixing, "BLOCK_BYTES", 8)
    monkeypatch.setattr(mixing, "_SPARE", [])
    x = torch.arange(12.0).reshape(6, 2)
    ring = [((k - 1) % 6) for k in range(6)]
    made = set()
    for _ in range(5):  # x <- W x on a ring: the one before the last result is free again each time
        prev = x
        x = mixing.mix_rows(x, torch.full((6,), 0.5, dtype=torch.float64),
                            [[(0.5, list(range(6)), (x, torch.tensor(ring)))]], {}, torch.float32)
        assert torch.equal(x, prev * 0.5 + prev[ring] * 0.5)
        made.add(id(x))
    assert len(made) <= 3  # three tensors at most: the spares, ping-ponged
