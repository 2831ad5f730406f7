"""Errors the user can fix: one line naming the file, the key path and what is allowed."""

from __future__ import annotations


class InputError(Exception):
    """Bad input (scenario, trace, CLI argument). The CLI prints it as one line and exits 2."""

    def __init__(self, key: str, message: str, source: str | None = None):
        super().__init__(key, message, source)  # all args, so copies (simpy re-raising) rebuild it
        self.key = key
        self.message = message
        self.source = source

    def at(self, source: str) -> InputError:
        """The same error, attributed to a file (kept if one is already named)."""
        return self if self.source else InputError(self.key, self.message, source)

    def __str__(self) -> str:
        head = f"{self.source}: " if self.source else ""
        key = f"{self.key}: " if self.key else ""
        return f"{head}{key}{self.message}"


class RunCrashed(Exception):
    """A run stopped by an exception raised inside the simulation (typically an algorithm's bug). Its
    folder keeps the partial trace and ``summary.partial.json``, whose ``error`` names the exception,
    where it was raised, the agent and the simulated time. The CLI prints it as one line and exits 1."""

    def __init__(self, folder, error: dict):
        super().__init__(folder, error)
        self.folder = folder
        self.error = error

    def __str__(self) -> str:
        e = self.error
        if e.get("inside_netsim"):
            who = " inside netsim" + (f" (while agent {e['agent']}'s program ran; a netsim bug, please report it)"
                                      if e.get("agent") is not None else " (a netsim bug, please report it)")
        else:
            who = f" in agent {e['agent']}'s program" if e.get("agent") is not None else ""
        msg = " ".join(str(e.get("message", "")).split())[:300]
        return (f"{self.folder}: the run crashed at t = {e['t']:.6g} s{who}: {e['type']}"
                f"{': ' + msg if msg else ''} (at {e['where']}); its partial trace and summary.partial.json "
                "(with the traceback) are kept there")


def claim(table: dict, what: str, name: str, value) -> None:
    """The registries' one rule (schedules, link models, accountants): ``table[name] = value`` for an
    identifier; the same value again is a no-op, another under a taken name raises ValueError."""
    if not name.isidentifier():
        raise ValueError(f"{what} name must be an identifier, got {name!r}")
    have = table.get(name)
    if have is not None and have is not value:
        raise ValueError(f"{what} {name!r} is already registered ({getattr(have, '__qualname__', have)})")
    table[name] = value


def did_you_mean(name: str, names) -> str:
    """``"did you mean 'dpsgd'? "`` for the registered or allowed name closest to a mistyped ``name`` (difflib's
    ratio >= 0.6), else ``""``: the hint every "unknown ..." line starts with."""
    import difflib

    near = difflib.get_close_matches(str(name), list(names), n=1, cutoff=0.6)
    return f"did you mean {near[0]!r}? " if near else ""


def unknown_name(what: str, name: str, registered) -> str:
    """The line for a name no registry holds: the likely intended one, every registered name, and that a
    plugin's name needs the plugin loaded (``unknown model 'residual_mlp'; registered: cnn, ...; a plugin's
    model needs --plugin FILE``)."""
    names = sorted(registered)
    return (f"unknown {what} {name!r}; {did_you_mean(name, names)}registered: {', '.join(names)}; "
            f"a plugin's {what} needs --plugin FILE")
