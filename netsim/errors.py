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
