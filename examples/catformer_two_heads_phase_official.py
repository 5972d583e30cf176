"""Full model: when do the two heads split? A phase diagram around the official recipe
===================================================================================

The two-parent experiment (``multi_parent.ipynb``, Figures 5/7): graph ``p(i) = ((i−1)//2, i−1)``, the
continuous ``DirichletTensorPrior(S, 2, 0.1)`` (roots uniform), ``CatFormer(S, T, heads=(2, 1))`` from
``Ã ~ 1e-4·N(0,1)``, ``W = 0``, ``optax.adamw`` lr 1e-2, wd 1e-4, cosine over 2^16 steps, batches of 1024.
At the official size (S = 5, T = 32) its two layer-1 heads end on one parent each. This script changes one
factor at a time, the official recipe otherwise, with 4 seeds per cell:

* ``size``: T ∈ {8, 12, 16, 24, 32} × S ∈ {2, 3, 5}, the official schedule (the cosine over 2^16 steps, of
  which the first ``--steps`` = 8192 run), the official start; at T = 16 and 32 also the exactly symmetric
  start plus an antisymmetric 1e-8 (``popgrad.symmetric_start(model, 1e-4, seed, 1e-8)``);
* ``noise``: batch 256, 1024, 4096 at S = 5, T = 16 and 32, and the **exact** population gradient at S = 2,
  T = 14 and 16 (the largest two-parent sizes at S = 2 that enumerate): does the split need sampling at all;
* ``schedule``: the cosine over 4096, 16384, 65536 steps at S = 5, T = 16 and 32 (the 4096 cosine runs its
  4096 steps: its learning rate is 0 after them);
* ``threshold``: S = 2 does not split at any T run, so the exact S = 2 cells cannot tell whether the split
  needs sampling; S = 3 splits at T = 16 and not at T = 8. This factor places the S = 3 threshold (sampled,
  T = 10, 12, 14) and runs the exact gradient at S = 3, T = 10 (59,049 sequences), the largest S = 3 size
  whose 8192 exact steps fit in about an hour of one core.

Every cell is one run of ``popgrad.train_catformer`` with a checkpoint (resumable, bit-identically) and its
parameters recorded every ``--record-every`` steps; the **split step** is the first record at which the
positional head × parent-slot matrix ``M[h, σ]`` (``popgrad.checks.catformer.slot_attention`` of the
positional blocks) is a permutation (``soft_split``) with both heads' lifts ``(a − 1/(i+1))/(1 − 1/(i+1))``
on their slot's parent, averaged over the rows, ≥ 1/2. A finished cell writes ``cells/<id>.json``;
``cells.csv`` (one row per finished run: ``factor, S, T, gradient, batch_size, schedule_steps, steps, seed,
start, split_step, final_loss, bayes_loss``; ``split_step`` empty when no split; the losses on a held-out
sample of ``--eval-n``, the Bayes loss that of the posterior predictive, which is the official ``bayes``
line for two parents) is rewritten after every cell, so a partial diagram is always on disk; ``--table-only``
rewrites it and the figure ``phase.png`` from the cells finished. The exact cells keep their recorded
parameters (``records/<id>.npz``); ``--spectra`` computes the head-antisymmetric Hessian spectrum (3
eigenvalues at each end, the tangent kernel) along them every ``--spectra-every`` steps (``spectra/<id>.json``,
``spectra.png``; a running cell's checkpoint is read as far as it got).

Why an example and not a ``popgrad sweep`` spec: ``popgrad run`` has no setting for a cosine longer than
the run (``--steps`` is also the schedule's length) nor for the symmetric start, two of the factors here.

Full diagram (about a day on 2 shared cores; resumable): ``python catformer_two_heads_phase_official.py
--out docs/results/two_heads_phase``; one factor: ``--factors size``; a slice: ``--cells 0:10``.
"""
import csv
import glob
import json
import os
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import popgrad as pg
from popgrad.app.plots import save_figure
from popgrad.checks import catformer as cc
from popgrad.train import optim

from _common import parser
from _official import model_predictions, read_checkpoint, write_json

OFFICIAL_SCHEDULE = 2**16
COLUMNS = ("factor", "S", "T", "gradient", "batch_size", "schedule_steps", "steps", "seed", "start", "split_step",
           "final_loss", "bayes_loss")


def args_of():
    p = parser(__doc__, "examples_out/catformer_two_heads_phase_official",
               quick_help="S = 2, T = 6, 2 cells of each factor, 48 steps, batch 64")
    p.add_argument("--factors", default="size,noise,schedule,threshold")
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--steps", type=int, default=8192)
    p.add_argument("--record-every", type=int, default=128)
    p.add_argument("--checkpoint-every", type=int, default=512)
    p.add_argument("--eval-n", type=int, default=8192)
    p.add_argument("--cells", default="", help="a slice of the cell list, e.g. 0:10 (default: all)")
    p.add_argument("--list", action="store_true", help="print the cells and their ids, run nothing")
    p.add_argument("--table-only", action="store_true", help="rewrite cells.csv and phase.png, run nothing")
    p.add_argument("--spectra", action="store_true",
                   help="the head-antisymmetric Hessian spectrum (3 eigenvalues at each end) along every exact "
                        "cell's recorded parameters (finished: records/; running: its checkpoint), into spectra/")
    p.add_argument("--spectra-every", type=int, default=1024, help="steps between two spectra (default 1024)")
    a = p.parse_args()
    a.factors = [f.strip() for f in a.factors.split(",") if f.strip()]
    bad = [f for f in a.factors if f not in ("size", "noise", "schedule", "threshold")]
    if bad:
        p.error(f"--factors {','.join(bad)}: use size, noise, schedule, threshold")
    if a.quick:
        a.steps, a.record_every, a.checkpoint_every, a.eval_n, a.seeds = 48, 8, 16, 256, 1
    return a


def cell_list(a):
    """Every cell of the diagram, in a fixed order (its index is stable as long as the factors are)."""
    out = []

    seen = {}

    def add(factor, S, T, gradient="sampled", batch=1024, sched=OFFICIAL_SCHEDULE, start="official", steps=None):
        for seed in range(a.seeds):
            c = dict(factor=factor, S=S, T=T, gradient=gradient, batch_size=batch if gradient == "sampled"
                     else None, schedule_steps=sched, steps=min(steps or a.steps, sched), seed=seed, start=start)
            k = cell_id(c)
            if k in seen:  # the official cell of one factor is a cell of another: run once, listed under both
                if factor not in seen[k]["factor"].split("+"):
                    seen[k]["factor"] += "+" + factor
                continue
            seen[k] = c
            out.append(c)
    if a.quick:
        for f in a.factors:
            add(f, 2, 6, batch=64, sched=96 if f == "schedule" else OFFICIAL_SCHEDULE)
            add(f, 2, 6, gradient="exact" if f == "noise" else "sampled", batch=64,
                start="symmetric" if f == "size" else "official")
        return out
    if "size" in a.factors:
        for T in (8, 12, 16, 24, 32):
            for S in (2, 3, 5):
                add("size", S, T)
                if T in (16, 32):
                    add("size", S, T, start="symmetric")
    if "noise" in a.factors:
        for T in (16, 32):
            for b in (256, 1024, 4096):
                add("noise", 5, T, batch=b)
        for T in (14, 16):
            add("noise", 2, T, gradient="exact")
    if "schedule" in a.factors:
        for T in (16, 32):
            for sched in (4096, 16384, 65536):
                add("schedule", 5, T, sched=sched, steps=max(a.steps, 4096) if sched > 4096 else 4096)
    if "threshold" in a.factors:  # where S = 3 starts to split, and the exact gradient at a size that enumerates
        for T in (10, 12, 14):
            add("threshold", 3, T)
        add("threshold", 3, 10, gradient="exact")
    return out


def cell_id(c):
    g = f"b{c['batch_size']}" if c["gradient"] == "sampled" else "exact"
    return f"S{c['S']}_T{c['T']}_{g}_c{c['schedule_steps']}_n{c['steps']}_{c['start']}_s{c['seed']}"


def setup(c):
    task = pg.MultiParentTask(pg.two_parent(c["T"]), pg.DirichletTensorPrior(c["S"], 2, 0.1))
    return task, pg.CatFormer(c["S"], c["T"], heads=(2, 1))


def optimizer_of(c):
    """``optax.adamw(optax.cosine_decay_schedule(1e-2, schedule_steps), weight_decay=1e-4)``."""
    return optim.adamw(optim.cosine_decay_schedule(1e-2, c["schedule_steps"]), weight_decay=1e-4)


def split_of(task, model, A1, S):
    """``(split?, M, lifts)`` of one record's layer-1 heads (positional blocks)."""
    z = np.where(np.tri(model.T, dtype=bool), A1[:, S:, S:], -np.inf)
    z = np.exp(z - z.max(axis=2, keepdims=True))
    P = z / z.sum(axis=2, keepdims=True)
    M = cc.slot_attention(task.graph, P)
    slots = np.stack([task.graph.slot_parents(s) for s in range(2)])
    rows = np.flatnonzero(slots[0] >= 0)
    u = 1.0 / (rows + 1.0)
    best = M.argmax(axis=1)
    lifts = [float(np.mean((P[h, rows, slots[best[h], rows]] - u) / (1 - u))) for h in range(2)]
    return bool(cc.soft_split(M) and min(lifts) >= 0.5), M, lifts


def run_cell(a, c):
    cid = cell_id(c)
    path = os.path.join(a.out, "cells", f"{cid}.json")
    if os.path.exists(path):
        with open(path) as fh:
            return json.load(fh)
    task, model = setup(c)
    ckpt = os.path.join(a.out, "checkpoints", f"{cid}.npz")
    init = (pg.symmetric_start(model, 1e-4, c["seed"], 1e-8) if c["start"] == "symmetric"
            else ("normal", 1e-4, c["seed"]))
    kw = dict(gradient=c["gradient"], sample_seed=1000 + c["seed"]) if c["gradient"] == "sampled" else {}
    if c["gradient"] == "sampled":
        kw["batch_size"] = c["batch_size"]
    t0 = time.perf_counter()
    traj = pg.train_catformer(task, model, c["steps"], optimizer=optimizer_of(c), init=init,
                              record_every=a.record_every, checkpoint_path=ckpt,
                              checkpoint_every=a.checkpoint_every, resume=os.path.exists(ckpt),
                              **({"gradient": "exact"} if c["gradient"] == "exact" else kw))
    _, _, rec, _ = read_checkpoint(model, ckpt)
    split_step, M_end, lifts_end = None, None, None
    for k, step in enumerate(rec["step"]):
        ok, M, lifts = split_of(task, model, rec["A_1"][k], c["S"])
        if ok and split_step is None:
            split_step = int(step)
        M_end, lifts_end = M, lifts
    smp = task.sample(a.eval_n, 10**6 + c["seed"])
    y = smp.targets
    with np.errstate(divide="ignore", invalid="ignore"):
        lm = -np.sum(np.where(y > 0, y * np.log(model_predictions(model, traj.final, smp.seqs)), 0.0), axis=1)
        lb = -np.sum(np.where(y > 0, y * np.log(pg.official_bayes_predict(task.graph, smp.seqs, c["S"], 0.1)),
                              0.0), axis=1)
    r = dict(c, id=cid, split_step=split_step, final_loss=float(lm.mean()),
             final_loss_se=float(lm.std(ddof=1) / np.sqrt(lm.size)), bayes_loss=float(lb.mean()),
             status=traj.status, steps_completed=int(traj.step[-1]), M_final=np.round(M_end, 4).tolist(),
             lifts_final=lifts_end, seconds=time.perf_counter() - t0, eval_n=a.eval_n)
    if c["gradient"] == "exact":  # the exact runs' recorded parameters stay: the Hessian spectra along them
        from popgrad._io import atomic_savez

        os.makedirs(os.path.join(a.out, "records"), exist_ok=True)
        atomic_savez(os.path.join(a.out, "records", f"{cid}.npz"), **{k: v for k, v in rec.items()})
    write_json(path, r)
    os.remove(ckpt)  # the record keeps what the diagram needs; the checkpoint (all records) would not stay small
    return r


def table(a):
    recs = []
    factors = {cell_id(c): c["factor"] for c in cell_list(a)}  # the factors of today's list (a cell of several)
    for p in sorted(glob.glob(os.path.join(a.out, "cells", "*.json"))):
        with open(p) as fh:
            r = json.load(fh)
        r["factor"] = factors.get(r["id"], r["factor"])
        recs.append(r)
    from popgrad._io import atomic_path

    with atomic_path(os.path.join(a.out, "cells.csv")) as tmp:
        with open(tmp, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(COLUMNS)
            for r in recs:
                w.writerow(["" if r.get(k) is None else r[k] for k in COLUMNS])
    if not recs:
        return recs
    fig, axs = plt.subplots(1, 4, figsize=(16, 3.8), gridspec_kw={"width_ratios": [4, 2, 2, 1.5]})
    for ax, factor in zip(axs, ("size", "noise", "schedule", "threshold")):
        rs = [r for r in recs if factor in r["factor"].split("+")]
        keys = sorted({(r["S"], r["T"], r["gradient"], r["batch_size"] or 0, r["schedule_steps"], r["start"])
                       for r in rs})
        for j, key in enumerate(keys):
            cell = [r for r in rs if (r["S"], r["T"], r["gradient"], r["batch_size"] or 0, r["schedule_steps"],
                                      r["start"]) == key]
            for r in cell:  # the seeds side by side, so no mark hides another
                y = r["split_step"] if r["split_step"] is not None else r["steps"] * 1.15
                ax.plot(j + 0.12 * (r["seed"] - 1.5), y, "o" if r["split_step"] is not None else "x",
                        color="tab:blue" if r["split_step"] is not None else "tab:red")
            n_split = sum(r["split_step"] is not None for r in cell)
            ax.text(j, 1.6e4, f"{n_split}/{len(cell)}", ha="center", fontsize=7)
        ax.set_ylim(1e3, 2.2e4)
        ax.set_xlim(-0.6, len(keys) - 0.4)
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels([f"S{k[0]} T{k[1]} {'ex' if k[2] == 'exact' else 'b' + str(k[3])} c{k[4]} {k[5][:3]}"
                            for k in keys], rotation=90, fontsize=6)
        ax.set_yscale("log")
        ax.set_title(factor, fontsize=9)
    axs[0].set_ylabel("split step")
    fig.suptitle("The two heads: split step (o) or no split by the end (x), one mark per seed; splits/seeds above",
                 fontsize=9)
    fig.tight_layout()
    save_figure(fig, os.path.join(a.out, "phase.png"))
    return recs


def spectra(a):
    """The head-antisymmetric spectrum of the exact Hessian along each exact cell's records: ``spectra/<id>.json``
    (step, loss, the 3 smallest and 3 largest eigenvalues, products, CPU seconds) and ``spectra.png``."""
    out = {}
    for c in cell_list(a):
        if c["gradient"] != "exact":
            continue
        cid = cell_id(c)
        task, model = setup(c)
        src = os.path.join(a.out, "records", f"{cid}.npz")
        if os.path.exists(src):
            with np.load(src) as z:
                rec = {k: np.array(z[k]) for k in z.files}
        else:
            got = read_checkpoint(model, os.path.join(a.out, "checkpoints", f"{cid}.npz"))
            if got is None:
                continue
            rec = got[2]
        path = os.path.join(a.out, "spectra", f"{cid}.json")
        done = {}
        if os.path.exists(path):
            with open(path) as fh:
                done = {p["step"]: p for p in json.load(fh)["points"]}
        points = []
        for k, step in enumerate(rec["step"]):
            step = int(step)
            if step % a.spectra_every and step != int(rec["step"][-1]):
                continue
            if step in done:
                points.append(done[step])
                continue
            params = pg.CatFormerParams([rec["A_1"][k], rec["A_2"][k]], rec["W"][k])
            t0 = time.process_time()
            sp = pg.hessian_spectrum(task, model, params, k=3, which="both", subspace="head_antisymmetric", tol=1e-6)
            points.append({"step": step, "loss": float(rec["loss"][k]), "values": [float(v) for v in sp.values],
                           "n_products": int(sp.n_products), "cpu_seconds": time.process_time() - t0})
            write_json(path, {"id": cid, "subspace": "head_antisymmetric", "points": points})
            print(f"{cid} step {step}: eigenvalues {np.round(sp.values, 6).tolist()}", flush=True)
        if points:
            write_json(path, {"id": cid, "subspace": "head_antisymmetric", "points": points})
            out[cid] = points
    if out:
        fig, ax = plt.subplots(figsize=(6.5, 3.8))
        for cid, pts in out.items():
            st = [p["step"] for p in pts]
            ax.plot(st, [p["values"][0] for p in pts], "o-", label=f"{cid}: smallest")
            ax.plot(st, [p["values"][-1] for p in pts], "x--", label=f"{cid}: largest")
        ax.axhline(0.0, color="gray", lw=0.8)
        ax.set_xlabel("step")
        ax.set_ylabel("eigenvalue of the head-antisymmetric Hessian")
        ax.legend(fontsize=6)
        fig.tight_layout()
        save_figure(fig, os.path.join(a.out, "spectra.png"))
    return out


def main():
    a = args_of()
    cells = cell_list(a)
    if a.cells and ":" not in a.cells:
        raise SystemExit(f"--cells {a.cells}: give a slice such as 0:10 (--list shows the indices)")
    if a.cells:
        lo, _, hi = a.cells.partition(":")
        cells = cells[int(lo or 0): int(hi) if hi else None]
    if a.list:
        for k, c in enumerate(cells):
            print(k, cell_id(c))
        return
    os.makedirs(os.path.join(a.out, "cells"), exist_ok=True)
    os.makedirs(os.path.join(a.out, "checkpoints"), exist_ok=True)
    if a.spectra:
        spectra(a)
        return
    if not a.table_only:
        for c in cells:
            r = run_cell(a, c)
            print(f"{r['id']}: split step {r['split_step']}, loss {r['final_loss']:.4f} (Bayes {r['bayes_loss']:.4f}), "
                  f"{r['seconds']:.0f} s", flush=True)
            table(a)
    recs = table(a)
    print(f"{len(recs)} of {len(cell_list(a))} cells finished; cells.csv in {a.out}")


if __name__ == "__main__":
    main()
