"""The seam's cost (DESIGN §26): the front end and the one trainer against the old entries, in one run.

    python benchmarks/bench_seam.py            # S = 3, chain T = 10 (59,049 sequences); --repeats N

Rows, each the median of ``--repeats`` calls after a warm-up, CPU time (``time.process_time``):

* ``exact_loss_and_grad`` vs ``loss_and_grad(ReducedModel)`` (the same engine behind the validation);
* ``catformer_loss_and_grad`` vs ``loss_and_grad(CatFormer)``;
* the generic engine on the reduced model's NumPy rows (a model the front end does not know) vs the prefix
  engine: what a new model costs before it gets a fast engine;
* one step of ``train_two_stage`` vs ``train_model`` (Algorithm 1's stages, the same bits) on a small task,
  where the trainer's own work shows.

Printed, never asserted: timings depend on the machine and its load.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import popgrad as pg
from popgrad.train.model_trainer import algorithm1_stages


class Plain:
    """The reduced model behind the protocol only (no fast engine): the generic engine runs it."""

    def __init__(self, inner):
        self.inner, self.S, self.T = inner, inner.S, inner.T

    def param_shapes(self):
        return self.inner.param_shapes()

    def init(self, scale, seed):
        return self.inner.init(scale, seed)

    def predict(self, p, seqs):
        return self.inner.predict(p, seqs)

    def loss_and_grad_rows(self, p, seqs, w, eps):
        return self.inner.loss_and_grad_rows(p, seqs, w, eps)

    def layer1_attention(self, p, seqs):
        return self.inner.layer1_attention(p, seqs)


def _median(f, repeats):
    f()
    times = []
    for _ in range(repeats):
        t = time.process_time()
        f()
        times.append(time.process_time() - t)
    return float(np.median(times))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--T", type=int, default=10)
    args = ap.parse_args(argv)
    T, S = args.T, 3
    task = pg.Task(pg.chain(T), pg.dirichlet_prior(S=S, alpha=1.0, n_atoms=4, seed=0))
    m = pg.ReducedModel(S, T)
    p = m.init(0.5, 0)
    c = pg.CatFormer(S, T)
    pc = c.init(0.1, 0)
    rows = [
        ("reduced: exact_loss_and_grad", lambda: pg.exact_loss_and_grad(task, p["A1"], p["A2"]),
         "loss_and_grad(ReducedModel)", lambda: pg.loss_and_grad(task, m, p)),
        ("full: catformer_loss_and_grad", lambda: pg.catformer_loss_and_grad(task, c, pc),
         "loss_and_grad(CatFormer)", lambda: pg.loss_and_grad(task, c, pc)),
        ("reduced: prefix engine", lambda: pg.loss_and_grad(task, m, p),
         "generic engine (NumPy rows)", lambda: pg.loss_and_grad(task, Plain(m), p)),
    ]
    small = pg.Task(pg.chain(6), pg.dirichlet_prior(S=3, alpha=1.0, n_atoms=4, seed=0))
    ms = pg.ReducedModel(3, 6)
    n = 200
    cfg = pg.TrainConfig(beta0=0.5, lr1=1.0, steps1=n // 2, lr2=1.0, steps2=n // 2, record_every=10)
    stages = algorithm1_stages(small, n // 2, n // 2, 1.0, 1.0, 0.5)
    rows.append(("train_two_stage, per step (T = 6)", lambda: pg.train_two_stage(small, config=cfg),
                 "train_model, per step", lambda: pg.train_model(small, ms, n, init=ms.start(0.5), stages=stages,
                                                                 optimizer="gd", record_every=10)))
    print(f"S = {S}, T = {T} ({S**T:,} sequences), median of {args.repeats} (CPU s)")
    print(f"{'old entry':34s} {'s':>9s}   {'through the seam':30s} {'s':>9s} {'ratio':>7s}")
    for i, (a, fa, b, fb) in enumerate(rows):
        ta, tb = _median(fa, args.repeats), _median(fb, args.repeats)
        if i == len(rows) - 1:
            ta, tb = ta / n, tb / n
        print(f"{a:34s} {ta:9.5f}   {b:30s} {tb:9.5f} {tb / ta:7.2f}")


if __name__ == "__main__":
    main()
