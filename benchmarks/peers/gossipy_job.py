"""The gossip-learning job of bench_gossip_learning.py, run by the peer simulator gossipy (gossipy-dfl).

Run with the Python of an environment that has gossipy installed (it is not a netsim dependency):

    PEER_PYTHON -m pip install gossipy-dfl          (with torch pinned as for netsim)
    PEER_PYTHON benchmarks/peers/gossipy_job.py --nodes 1000 --data ../shared/data/mushrooms/mushrooms.libsvm

The same job as netsim's: mushrooms, 80/20 split, IID parts, logistic regression, a random 4-regular graph,
every node pushes its model to one random neighbour once per round (merge-then-update on each receipt, one
SGD step of lr 0.5 on its whole local part; gossipy's two-logit softmax at lr 0.5 is netsim's binary
logistic regression at lr 1.0), messages lost with probability 0.1 and delayed uniformly in
[0.01, 0.5] s (gossipy's time is discrete: 100 steps per 1 s round, delays 1..50 steps), 100 rounds,
evaluation at the end only (outside the timed part). Prints one JSON line: simulation wall and CPU
seconds (``GossipSimulator.start``) and the nodes' mean test accuracy.
``--async``: gossipy's asynchronous nodes (``sync=False``: a node's activation falls at a random step of each
round, its own timer), the peer's form of netsim's jobs with Poisson clocks; ``--delay 5 50`` for [0.05, 0.5] s.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def read_libsvm(path: str) -> tuple[np.ndarray, np.ndarray]:
    rows, labels, width = [], [], 0
    with open(path) as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            labels.append(float(parts[0]))
            feats = {int(k): float(v) for k, v in (p.split(":") for p in parts[1:])}
            width = max(width, max(feats, default=0))
            rows.append(feats)
    X = np.zeros((len(rows), width), dtype=np.float32)
    for i, feats in enumerate(rows):
        for k, v in feats.items():
            X[i, k - 1] = v
    y = np.asarray(labels)
    return X, (y == y.max()).astype(np.int64)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--data", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--async", dest="asynchronous", action="store_true",
                    help="gossipy's asynchronous nodes (sync=False: each node's timeout drawn at random in the round)")
    ap.add_argument("--delay", type=int, nargs=2, default=[1, 50], metavar=("MIN", "MAX"),
                    help="message delay in steps of 1/100 round (uniform; default 1 50: 0.01-0.5 s)")
    args = ap.parse_args()

    import sys
    import types

    import networkx as nx
    import torch

    # gossipy.data imports torchvision for its CIFAR/FashionMNIST loaders only (unused here); torchvision has
    # no usable build beside the pinned torch on these machines, so an empty module stands in for it
    sys.modules.setdefault("torchvision", types.ModuleType("torchvision"))
    from gossipy import set_seed
    from gossipy.core import AntiEntropyProtocol, CreateModelMode, StaticP2PNetwork, UniformDelay
    from gossipy.data import DataDispatcher
    from gossipy.data.handler import ClassificationDataHandler
    from gossipy.model.handler import TorchModelHandler
    from gossipy.model.nn import LogisticRegression
    from gossipy.node import GossipNode
    from gossipy.simul import GossipSimulator

    torch.set_num_threads(1)
    set_seed(args.seed)
    X, y = read_libsvm(args.data)
    rng = np.random.default_rng(args.seed)
    perm = rng.permutation(len(y))
    n_test = int(0.2 * len(y))
    te, tr = perm[:n_test], perm[n_test:]
    handler = ClassificationDataHandler(torch.from_numpy(X[tr]), torch.from_numpy(y[tr]), test_size=0.0)
    dispatcher = DataDispatcher(handler, n=args.nodes, eval_on_user=False, auto_assign=True)
    graph = nx.random_regular_graph(4, args.nodes, seed=args.seed)
    net = StaticP2PNetwork(args.nodes, topology=nx.to_numpy_array(graph))
    proto = TorchModelHandler(net=LogisticRegression(X.shape[1], 2), optimizer=torch.optim.SGD,
                              optimizer_params={"lr": 0.5}, criterion=torch.nn.CrossEntropyLoss(),
                              local_epochs=1, batch_size=0, create_model_mode=CreateModelMode.MERGE_UPDATE)
    delta = 100
    nodes = {i: GossipNode(idx=i, data=dispatcher[i], round_len=delta, model_handler=proto.copy(), p2p_net=net,
                           sync=not args.asynchronous) for i in range(args.nodes)}
    sim = GossipSimulator(nodes=nodes, data_dispatcher=dispatcher, delta=delta,
                          protocol=AntiEntropyProtocol.PUSH, drop_prob=0.1, delay=UniformDelay(*args.delay))
    sim.init_nodes(seed=args.seed)
    t0, c0 = time.perf_counter(), time.process_time()
    sim.start(n_rounds=args.rounds)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    Xt, yt = torch.from_numpy(X[te]), torch.from_numpy(y[te])
    with torch.no_grad():
        acc = [float((n.model_handler.model(Xt).argmax(1) == yt).float().mean()) for n in nodes.values()]
    print(json.dumps({"peer": "gossipy", "nodes": args.nodes, "async": args.asynchronous, "sim_s": wall, "cpu_s": cpu,
                      "accuracy": float(np.mean(acc))}))


if __name__ == "__main__":
    main()
