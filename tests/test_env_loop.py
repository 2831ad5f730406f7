"""netsim's Environment (sim/env.py): its event loop ``steps``, ``step`` and ``Timeout`` process the events simpy's
own would, in the same order, stopping where the kernel's loop asks (a boundary, a limit, the run's end)."""

from __future__ import annotations

import random

import pytest
import simpy

from netsim.sim.env import Environment, Timeout


class _Marks:
    def __init__(self, at: float):
        self.next_boundary = at


def _world(env, log: list, seed: int, timeout_cls) -> None:
    """Processes that wait on timeouts (ties included), succeed shared events and stop: what a run's programs do."""
    rng = random.Random(seed)
    gate = env.event()

    def proc(i: int):
        for k in range(rng.randint(1, 6)):
            d = rng.choice([0.0, 0.5, 1.0, rng.random() * 3])
            v = yield timeout_cls(env, d, (i, k))
            log.append((env.now, "t", v))
            if k == 2 and not gate.triggered:
                gate.succeed(i)
        got = yield gate
        log.append((env.now, "gate", i, got))

    for i in range(12):
        env.process(proc(i))


@pytest.mark.parametrize("seed", range(5))
def test_steps_process_what_simpy_does_in_its_order(seed):
    plain, ours = [], []
    ref = simpy.Environment()
    _world(ref, plain, seed, simpy.events.Timeout)
    ref.run()
    env = Environment()
    _world(env, ours, seed, Timeout)
    n, marks = 0, _Marks(1.0)  # stop at each boundary, as the kernel's loop does, then go on
    while env.queue:
        n = env.steps(n, -1, [], marks)
        assert not env.queue or env.queue[0][0] >= marks.next_boundary
        marks.next_boundary += 1.0
    assert ours == plain and ours
    assert env.now == ref.now


def test_steps_stop_at_the_limit_and_when_done_and_step_takes_one():
    env = Environment()
    for d in (0.1, 0.2, 0.3, 0.4):
        Timeout(env, d)
    assert env.steps(0, 2, [], _Marks(10.0)) == 2 and env.now == 0.2
    assert env.steps(2, -1, ["stop"], _Marks(10.0)) == 2  # the run stopped: nothing processed
    env.step()
    assert env.now == 0.3 and env.queued() == 1
    env.advance_to(5.0)
    assert env.now == 5.0
    with pytest.raises(ValueError, match="Negative delay"):
        Timeout(env, -1.0)


def test_a_failing_callback_raises_with_the_events_processed_counted():
    env = Environment()

    def boom():
        yield Timeout(env, 1.0)
        raise RuntimeError("the program failed")

    Timeout(env, 0.5)
    env.process(boom())
    with pytest.raises(RuntimeError, match="the program failed"):
        env.steps(0, -1, [], _Marks(10.0))
    assert env.processed == 3  # its start and two timeouts; not the failed process event that raised
