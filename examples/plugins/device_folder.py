"""A plugin dataset: one CSV file per device in a folder (a sensor deployment, a phone per user), read
with numpy; each file's rows are one group, so ``partition = "groups"`` gives every agent whole devices.

    devices/
        phone_a.csv     # header: the feature names and the target column; one reading per line
        phone_b.csv
        ...

``data.path`` names the folder (beside the scenario file, else in $NETSIM_DATA); the loader's own
``[data]`` keys pick the files and the target column. Nothing is downloaded. Selected by name:

    [data]
    kind = "device_folder"
    path = "devices"
    target = "activity"
    partition = "groups"

    netsim run my_scenario.toml --plugin examples/plugins/device_folder.py
"""

from __future__ import annotations

import attrs
import numpy as np

from netsim.compute.data import DataSource, Rows, register_dataset
from netsim.errors import InputError
from netsim.scenario.structure import field


@attrs.frozen
class DeviceParams:
    pattern: str = field("*.csv", doc="which files of the folder are devices (a glob)")
    target: str = field("label", doc="the column holding each reading's label")


def device_folder(args: DeviceParams, src: DataSource) -> Rows:
    """One CSV per device in a folder; the device (file name without suffix) is each row's group."""
    files = sorted(src.folder().glob(args.pattern))
    if not files:
        raise InputError("data.path", f"{src.folder()}: no files match {args.pattern!r}")
    X, y, groups = [], [], []
    for f in files:
        header = f.read_text(encoding="utf-8").split("\n", 1)[0].strip().split(",")
        if args.target not in header:
            raise InputError("data.target", f"{f}: no column {args.target!r}; columns: {', '.join(map(repr, header))}")
        rows = np.loadtxt(f, delimiter=",", skiprows=1, ndmin=2)
        t = header.index(args.target)
        X.append(np.delete(rows, t, axis=1))
        y.append(rows[:, t].astype(np.int64))
        groups += [f.stem] * len(rows)
    return Rows(np.concatenate(X).astype(np.float32), np.concatenate(y), np.array(groups))


register_dataset("device_folder", device_folder, DeviceParams)
