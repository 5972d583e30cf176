"""Finite samples, exactly
=======================

Finite samples, exactly: the gradient's noise, SGD against population descent, and Stage 1's N_min.

Everything is computed from the exact moments of the per-sample gradient
(``popgrad.gradient_noise``: mean and covariance over all S**T sequences of a
finite prior); the simulations (SGD runs, simulated ranking events) are seeded
and labelled as such.

1. **N_min sweep.** At A1 = 0, A2 = β0·I, the smallest batch N whose Stage-1
   gradient ranks the parent first in every non-root row with probability
   ≥ 0.99 (Gaussian limit, ``checks.check_sample_complexity``), over T, for
   the chain, ICL, a random tree (seed 0; a new tree at each T) and a random
   tree of two chains (T_eff = T/2 grows), under two priors inside Knowl 10:
   S = 2, π = [[.8,.2],[.2,.8]] and its swap at equal weights (γ = 0.4, uniform
   mean), and S = 3, Dirichlet(1) draws (4, closed under relabeling, uniform-mean
   tilt) mixed half-and-half with the uniform matrix (γ ≥ 0.5). Fit against
   T_eff log T_eff (constant, residuals) and against a + b log T_eff. The
   check itself (with a simulation at three N) for one T per graph.
2. **SGD vs exact.** Algorithm 1 (β0 = 1e-3, lr1 = lr2 = 2, 300 + 300 steps)
   on the chain, exactly and by SGD with fresh batches (``gradient="sgd"``)
   for several batch sizes and seeds: ‖A1_sgd − A1_gd‖ and the loss gap
   against the linear-response prediction from the exact covariance
   (``checks.sgd_spread``) and the random walk (cov/B summed).
3. **Stage-1 steps that point the right way at B = 1024** along the exact
   Stage-1 trajectory (Gaussian limit, per step) and along one SGD run
   (observed): the ranking event in every non-root row, and a descent
   direction of the population loss (cos(batch gradient, exact gradient) > 0);
   the two priors of 1. and the official α = 0.1 (Dirichlet draws closed under
   relabeling, outside Knowl 10).
4. **The theorem's event: graph recovery after a sampled Stage 1** of the
   trainer's length (β0 = 1e-3, lr1 = 2, 300 steps, η1 = lr1·S·T/β0;
   ``checks.sample_complexity.recovery_n_min``), over seeds, against N and T:
   on one fixed sample of N sequences (gradient descent on the empirical
   loss) and on fresh batches of N per step (the official SGD). N_min: the
   smallest N whose recovery frequency over the seeds is ≥ 0.9 (grid, Wilson
   intervals) and a probit fit to every seeded outcome (with its standard
   error); the population reference by enumeration or the Stage-1 field
   (T beyond enumeration). Fits of N_min(T_eff): a + b log T_eff, c·T_eff^e and
   the paper's C·T_eff·log T, weighted by the probit errors, with χ²/dof.

Writes ``nmin_table.md``, ``sgd_table.md``, ``stage1_fraction.md``,
``recovery_table.md``, ``nmin.png``, ``sgd_distance.png``, ``recovery_nmin.png``
into ``--out``. ``--quick`` (seconds, a smoke test of every section): a few small T per sweep, fewer
replicates, seeds and batch sizes, and section 4 with a 100-step Stage 1 (150 for the long family) and no
refinement of the last octave. ``--sections recovery`` runs only
section 4 (``--sections nmin,sgd,fraction,recovery`` is the default: all).
"""
import math
import os
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import popgrad as pg
from popgrad import checks
from popgrad.app.plots import save_figure
from popgrad.checks.sample_complexity import (fit_n_min_laws, joint_gaussian_probability, population_stage1_recovery,
                                             ranking_model, recovery_n_min, sample_complexity_sweep)
from popgrad.engine.single import rows_loss_and_grad
from scipy.special import ndtr

from _common import ensure_out, parser, random_branching

PAIR = pg.FinitePrior([[[.8, .2], [.2, .8]], [[.2, .8], [.8, .2]]])
GRAPHS = {"chain": pg.chain, "icl": pg.icl_pairs, "random tree": lambda T: pg.random_tree(T, seed=0)}


#: The N_min sweep adds a random tree family whose T_eff grows.
SWEEP_GRAPHS = dict(GRAPHS, **{"random 2-branch tree": random_branching})
TRAIN = dict(beta0=1e-3, lr1=2.0, steps1=300, lr2=2.0, steps2=300)
#: The Gaussian-limit columns of section 3 are evaluated on every this-many-th step of the exact run.
GAUSS_EVERY = 10


def mixed_prior(S=3, mix=0.5, n=4, seed=0):
    """Dirichlet(1) draws closed under relabeling with a uniform mean, mixed with the uniform matrix."""
    base = pg.dirichlet_prior(S, 1.0, n, seed=seed, uniform_mean=True)
    atoms = (1 - mix) * np.asarray(base.atoms) + mix / S
    return pg.FinitePrior(atoms, np.asarray(base.weights))


def knowl10(task):
    a = pg.assumptions(task)
    return f"γ = {a.gamma:.2f}, uniform mean {'yes' if a.uniform_mean else 'no'}, γ_all = {a.gamma_all:.2f}"


def nmin_section(quick, lines):
    priors = {"S=2 pair": (PAIR, [6, 7, 8] if quick else [6, 8, 10, 12, 14, 16, 18, 20]),
              "S=3 Dirichlet+uniform": (mixed_prior(), [4, 5, 6] if quick else [5, 6, 7, 8, 9, 10, 11, 12])}
    lines += ["## 1. Stage-1 N_min (level 0.99, β0 = 1e-3, Gaussian limit)", "",
              "| prior | graph | T | T_eff | N_min | N_min / (T_eff log T_eff) | min per-sample SNR z |",
              "|---|---|---|---|---|---|---|"]
    fits = []
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
    t0 = time.perf_counter()
    for pname, (prior, Ts) in priors.items():
        for gname, build in SWEEP_GRAPHS.items():
            sw = sample_complexity_sweep(build, prior, Ts, beta0=1e-3, level=0.99)
            for T, te, n, z in zip(sw["T"], sw["t_eff"], sw["N_min"], sw["z_min"]):
                ratio = n / (te * math.log(te)) if te > 1 else float("nan")
                lines.append(f"| {pname} | {gname} | {T} | {te:.2f} | {n} | {ratio:.2f} | {z:.3f} |")
            f = sw["fit"]
            fits.append((pname, gname, f, sw))
            k = 0 if pname.startswith("S=2") else 1
            ax[k].plot(sw["t_eff"], sw["N_min"], "o-", label=gname)
    sweep_seconds = time.perf_counter() - t0
    for k, pname in enumerate(priors):
        ax[k].set_xlabel("T_eff")
        ax[k].set_ylabel("N_min (P ≥ 0.99)")
        ax[k].set_title(pname, fontsize=9)
        ax[k].legend(fontsize=8)
    lines += ["", f"Sweep time: {sweep_seconds:.1f} s (all priors and graphs, this machine).", "",
              "Fits: N_min = C · T_eff log T_eff (least squares on logs; relative residuals), "
              "N_min = a + b log T_eff, and a free power law N_min ∝ T_eff^e.", "",
              "| prior | graph | C | residuals (T log T fit) | a | b | residuals (log fit) | e ± se |",
              "|---|---|---|---|---|---|---|---|"]
    for pname, gname, f, sw in fits:
        if f is None:
            continue
        r1 = ", ".join(f"{r:+.2f}" for r in f["residuals"])
        r2 = ", ".join(f"{r:+.2f}" for r in f["log_fit"]["residuals"])
        pl = f["power_law"]
        lines.append(f"| {pname} | {gname} | {f['C']:.3f} | {r1} | {f['log_fit']['a']:.1f} | "
                     f"{f['log_fit']['b']:.1f} | {r2} | {pl['exponent']:.2f} ± {pl['stderr']:.2f} |")
    save_figure(fig, os.path.join(ARGS.out, "nmin.png"))
    # the check with its simulation, one T per graph
    lines += ["", "The check with its seeded simulation (R batches of N fresh samples, every row jointly; "
              "Wilson 95 % intervals), S = 2 pair prior:", "",
              "| graph | T | Knowl 10 | N_min (Hunter) | N_min (Dawson–Sankoff) | N | Gaussian limit (rows independent) "
              "| Gaussian limit, full covariance (MC ± se) | simulated | 95 % interval |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    T = 6 if quick else 12
    for gname, build in GRAPHS.items():
        task = pg.Task(build(T), PAIR)
        res = checks.check_sample_complexity(task, beta0=1e-3, level=0.99, replicates=40 if quick else 4000)
        d = res.details
        for s in d["simulation"]:
            jg = joint_gaussian_probability(task, s["N"], draws=10_000 if quick else 400_000, seed=1)
            lines.append(f"| {gname} | {T} | {knowl10(task)} | {d['N_min']} | {d['N_min_optimistic']} | {s['N']} | "
                         f"{s['gaussian']:.4f} | {jg['value']:.4f} ± {jg['se']:.4f} | {s['frequency']:.4f} | "
                         f"[{s['ci95'][0]:.4f}, {s['ci95'][1]:.4f}] |")
    return lines


def sgd_section(quick, lines):
    T = 5 if quick else 8
    task = pg.Task(pg.chain(T), PAIR)
    kw = dict(TRAIN, steps1=30, steps2=30) if quick else TRAIN
    seeds = range(2) if quick else range(8)
    batches = [64, 256] if quick else [64, 256, 1024, 4096]
    gd = pg.train_two_stage(task, record_every=1, **kw)
    total = kw["steps1"] + kw["steps2"]
    at = [kw["steps1"] // 3, kw["steps1"], kw["steps1"] + kw["steps2"] // 3, total]
    lines += ["", f"## 2. SGD against the exact run (chain, T = {T}, S = 2 pair prior; β0 = 1e-3, lr1 = lr2 = 2, "
              f"{kw['steps1']} + {kw['steps2']} steps; {len(seeds)} seeds per batch size)", "",
              "Prediction: linear response Σ_{t+1} = F_t Σ_t F_tᵀ + Λ C_t Λ / B, F_t = I − Λ H_t (exact covariance "
              "C_t, Hessian H_t by central differences of the exact gradient, along the exact trajectory); "
              "RMS = √tr Σ. Random walk: F = I. Loss gap: measured mean and sd over seeds; predicted sd "
              "√(∇Lᵀ Σ ∇L), predicted quadratic mean ½ tr(H Σ).", "",
              "| B | step | RMS ‖A1_sgd − A1_gd‖ measured | linear response | random walk | RMS ‖A2_sgd − A2_gd‖ measured | "
              "linear response | loss gap mean ± sd (measured) | predicted sd | ½ tr(HΣ) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for B in batches:
        sp = checks.sgd_spread(task, gd, B)
        d1, d2, lg = [], [], []
        for seed in seeds:
            sg = pg.train_two_stage(task, gradient="sgd", batch_size=B, sample_seed=seed, record_every=1, **kw)
            d1.append(np.linalg.norm(sg.A1 - gd.A1, axis=(1, 2)))
            d2.append(np.linalg.norm(sg.A2 - gd.A2, axis=(1, 2)))
            lg.append(sg.loss - gd.loss)
        d1, d2, lg = np.array(d1), np.array(d2), np.array(lg)
        rms1, rms2 = np.sqrt((d1**2).mean(0)), np.sqrt((d2**2).mean(0))
        line, = ax.plot(rms1, label=f"B = {B} measured")
        ax.plot(sp.rms_A1, "--", color=line.get_color(), lw=1, label=f"B = {B} linear response")
        for t in at:
            lines.append(f"| {B} | {t} | {rms1[t]:.4f} | {sp.rms_A1[t]:.4f} | {sp.rms_A1_random_walk[t]:.4f} | "
                         f"{rms2[t]:.4f} | {sp.rms_A2[t]:.4f} | {lg[:, t].mean():+.2e} ± {lg[:, t].std():.2e} | "
                         f"{sp.loss_sd[t]:.2e} | {sp.loss_bias[t]:.2e} |")
    ax.set_yscale("log")
    ax.axvline(kw["steps1"], color="k", lw=0.6, ls=":")
    ax.set_xlabel("step")
    ax.set_ylabel("RMS ‖A1_sgd − A1_gd‖_F")
    ax.legend(fontsize=7, ncol=2)
    save_figure(fig, os.path.join(ARGS.out, "sgd_distance.png"))
    return lines


def fraction_section(quick, lines):
    B = 256 if quick else 1024
    cases = [("S=2 pair", PAIR, 6 if quick else 12), ("S=3 Dirichlet+uniform", mixed_prior(), 4 if quick else 8),
             ("S=3 Dirichlet(0.1), the official α (outside Knowl 10)", pg.dirichlet_prior(3, 0.1, 4, seed=0),
              4 if quick else 8)]
    steps1 = 20 if quick else TRAIN["steps1"]
    lines += ["", f"## 3. Stage-1 steps that point the right way at B = {B} (β0 = 1e-3, lr1 = 2, {steps1} steps)", "",
              "Ranking: the batch gradient ranks the parent first in every non-root row. Descent: "
              "cos(batch ∇_{A1}, exact ∇_{A1}) > 0. Gaussian limit averaged over every "
              f"{GAUSS_EVERY}th step of the exact Stage-1 trajectory (the descent probability is "
              "Φ(‖g‖² / √(gᵀ C g / B))); observed on every step of one SGD run (seed 0).", "",
              "| prior | graph | T | Knowl 10 | ranking, Gaussian limit | ranking, observed | descent, Gaussian limit | "
              "descent, observed |", "|---|---|---|---|---|---|---|---|"]
    for pname, prior, T in cases:
        for gname, build in GRAPHS.items():
            task = pg.Task(build(T), prior)
            gd = pg.train_two_stage(task, beta0=1e-3, lr1=2.0, steps1=steps1, steps2=0, record_every=1)
            sg = pg.train_two_stage(task, gradient="sgd", batch_size=B, sample_seed=0, beta0=1e-3, lr1=2.0,
                                    steps1=steps1, steps2=0, record_every=1)
            A2 = 1e-3 * np.eye(task.S)
            rank_g, desc_g, rank_o, desc_o = [], [], [], []
            parents = task.graph.parents
            rows = [i for i in range(T) if parents[i] >= 0 and i >= 1]
            for t in range(steps1):
                if t % GAUSS_EVERY == 0:  # the Gaussian limit on every GAUSS_EVERY-th step of the exact run
                    model = ranking_model(task, 1e-3, A1=gd.A1[t])
                    rank_g.append(model.probability(B) if all(np.all(z > 0) for z in model.z) else 0.0)
                    gn = pg.gradient_noise(task, gd.A1[t], A2)
                    D1 = T * (T + 1) // 2
                    r, c = np.tril_indices(T)
                    mean = gn.mean.dA1[r, c]
                    var = float(mean @ gn.cov[:D1, :D1] @ mean) / B
                    desc_g.append(float(ndtr(mean @ mean / math.sqrt(max(var, 1e-300)))))
                b = task.sample(B, np.random.SeedSequence([0, t]))
                dA1 = rows_loss_and_grad(b.seqs, b.targets / B, sg.A1[t], A2, task.default_eps).dA1
                ok = all(np.all(-dA1[i, parents[i]] > np.delete(-dA1[i, : i + 1], parents[i])) for i in rows)
                rank_o.append(ok)
                ex = pg.exact_loss_and_grad(task, sg.A1[t], A2).dA1
                desc_o.append(float(np.sum(dA1 * ex)) > 0)
            lines.append(f"| {pname} | {gname} | {T} | {knowl10(task)} | {np.nanmean(rank_g):.3f} (min {np.nanmin(rank_g):.3f}) | "
                         f"{np.mean(rank_o):.3f} | {np.mean(desc_g):.4f} | {np.mean(desc_o):.3f} |")
    return lines


#: Section 4's families of cases (``--cases``).
RECOVERY_FAMILIES = ("s2-fixed", "s2-fresh", "s3-fixed", "s3-fresh", "s2-fixed-long")
#: Section 4's level and the Stage-1 settings it runs (the trainer's defaults: the paper's length as popgrad runs it).
RECOVERY_LEVEL = 0.9
STAGE1 = dict(beta0=1e-3, lr1=2.0, steps1=300)


def _fmt_n(x):
    if not math.isfinite(x):
        return "∞"
    return str(int(x)) if float(x).is_integer() else f"{x:.0f}" if x >= 10 else f"{x:.1f}"


def _fit_cell(f):
    if f is None or not math.isfinite(f["N_level"]):
        return "—"
    lo, hi = f["ci95"]
    tag = " (separated)" if f["separated"] else ""
    return f"{_fmt_n(f['N_level'])} ± {100 * f['log_se']:.0f} % [{_fmt_n(lo)}, {_fmt_n(hi)}]{tag}"


def recovery_section(quick, lines):
    """Section 4: the finite-sample theorem's event (graph recovery after a sampled Stage 1)."""
    S3 = mixed_prior()
    Ts2 = [4, 5, 6] if quick else [6, 8, 10, 12, 14, 16, 18, 20, 24, 32]
    Ts3 = [4] if quick else [5, 6, 7, 8, 9, 10, 11, 12]
    seeds2, seeds = (4, 2) if quick else (40, 20)
    refine = 1 if quick else 4  # the last octave's grid steps (1: none)
    tree = GRAPHS["random tree"]
    families = {"s2-fixed": [("S=2 pair", PAIR, "chain", pg.chain, Ts2, "fixed", "recovered", seeds2)],
                "s2-fresh": [("S=2 pair", PAIR, "chain", pg.chain, Ts2[:1] if quick else Ts2[:8], "fresh", "recovered",
                              seeds)],
                "s3-fixed": [("S=3 Dirichlet+uniform", S3, "random tree", tree, Ts3, "fixed", "parent_first", seeds)],
                "s3-fresh": [("S=3 Dirichlet+uniform", S3, "random tree", tree, Ts3, "fresh", "recovered", seeds)],
                # the same event with a longer Stage 1 (the population's attention rises, the slack over 1 - 1/T too)
                "s2-fixed-long": [("S=2 pair", PAIR, "chain", pg.chain, [5] if quick else [12, 20, 24], "fixed",
                                   "recovered", seeds, 1000)]}
    cases = [c for name in ARGS.cases.split(",") for c in families[name]]
    if ARGS.recovery_T:  # the same families at other T
        cases = [(*c[:4], ARGS.recovery_T, *c[5:]) for c in cases]
    lines += ["", f"## 4. The theorem's event: graph recovery after a sampled Stage 1 (level {RECOVERY_LEVEL})", "",
              f"Stage 1 as `train_two_stage` runs it (the paper's Algorithm 1 at popgrad's defaults): β0 = "
              f"{STAGE1['beta0']:g}, lr1 = {STAGE1['lr1']:g}, {STAGE1['steps1']} steps, η1 = lr1·S·T/β0, A2 = β0·I "
              "frozen. *fixed*: gradient descent on the empirical loss of one sample of N sequences (soft labels); "
              "*fresh*: a fresh batch of N at every step (the official SGD; the run sees 300·N samples). Event "
              "*recovered*: Knowl 1.1 with C = 1 (softmax(A1)[i, p(i)] ≥ 1 − 1/T and the parent is the argmax, every "
              "non-root row; `checks.check_graph_recovery`); *parent first*: the argmax part only. Population: the "
              "same Stage 1 on the exact gradient (enumeration, S^T ≤ 2^14) or the Stage-1 field (beyond). "
              "N_min (grid): the smallest evaluated N (doubling from 1, then the last octave in steps of 2^(1/4)) "
              "whose frequency over the seeds is ≥ 0.9, with its Wilson 95 % interval, and the evaluated N below it. "
              "N_0.9 (probit): P(event | N) = Φ(a + b log N) fitted to every seeded outcome by maximum likelihood; "
              "± the delta-method standard error of log N_0.9, [95 % interval]. Ranking N_0.9: the old event "
              "(one gradient at A1 = 0 ranks the parent first in every row; Gaussian limit, rows independent) at "
              "the same level, where T enumerates.", "",
              "| prior | graph | mode | event searched | seeds | T | T_eff | population: min attention / 1 − 1/T "
              "(gradient) | ranking N_0.9 at A1 = 0 | N_min (grid) | freq. at N_min [95 %] | N below: freq. | "
              "N_0.9 (probit) ± se [95 %] | other event's N_0.9 (probit) | runs | CPU s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    fams = []
    t0 = time.perf_counter()
    for pname, prior, gname, build, Ts, mode, event, seeds, *more in cases:
        stage1 = dict(STAGE1, steps1=more[0]) if more else STAGE1
        if quick:  # a shorter Stage 1 (100 steps, the long family 150): the same code path in seconds
            stage1 = dict(stage1, steps1=150 if more else 100)
        fam = {"name": f"{pname}, {gname}, {mode}, {event.replace('_', ' ')}"
                       + (f", {stage1['steps1']} steps" if more else ""), "T": [], "t_eff": [], "N": [], "se": [],
               "grid": []}
        for T in Ts:
            task = pg.Task(build(T), prior)
            pop = population_stage1_recovery(task, **stage1)
            rank = "—"
            if task.S ** task.T <= 2**20:
                model = ranking_model(task, STAGE1["beta0"])
                rank = str(model.n_min(RECOVERY_LEVEL))
            if mode == "fresh" and task.S == 2:
                # fresh batches on the S = 2 chain: N = 1 already recovers; one N is the whole answer
                r = recovery_n_min(task, RECOVERY_LEVEL, seeds, event=event, mode=mode, n_max=1, population=pop,
                                   refine=refine, **stage1)
            else:
                r = recovery_n_min(task, RECOVERY_LEVEL, seeds, event=event, mode=mode, population=pop,
                                   n_max=2**14, refine=refine, **stage1)
            curve = {c["N"]: c for c in r["curve"]}
            nm = r["N_min"]
            if math.isfinite(nm):
                k = curve[nm][event]
                lo, hi = r["ci95_at_N_min"]
                at = f"{k}/{seeds} [{lo:.2f}, {hi:.2f}]"
                below = "—" if r["N_below"] is None else f"{r['N_below']}: {r['rate_below']:.2f}"
            else:
                at, below = r["reason"] or "—", "—"
            steps_note = f" ({stage1['steps1']} steps)" if more else ""
            lines.append(f"| {pname} | {gname} | {mode}{steps_note} | {event.replace('_', ' ')} | {seeds} | {T} | "
                         f"{task.t_eff:.2f} | "
                         f"{pop.min_attention:.4f} / {pop.threshold:.4f} ({pop.mode}) | {rank} | {_fmt_n(nm)} | {at} | "
                         f"{below} | {_fit_cell(r['fit'])} | {_fit_cell(r['fit_other'])} | {r['runs']} | "
                         f"{r['cpu_seconds']:.1f} |")
            print(lines[-1], flush=True)
            f = r["fit"]
            if f is not None and math.isfinite(f["N_level"]) and f["log_se"] > 0 and task.t_eff > 1:
                fam["T"].append(T)
                fam["t_eff"].append(float(task.t_eff))
                fam["N"].append(f["N_level"])
                fam["se"].append(f["log_se"])
                fam["grid"].append(nm)
        fams.append(fam)
    lines += ["", f"Section time: {time.perf_counter() - t0:.0f} s wall (loaded 2-core machine).", "",
              "Fits of N_0.9 (probit) against T_eff, weighted least squares with the probit standard errors: "
              "N = a + b log T_eff (weights 1/(N·se)²), log N = log c + e log T_eff and the paper's "
              "log N = log C + log(T_eff log T) (weights 1/se²). ± are standard errors from the given errors; "
              "χ²/dof near 1 means the law fits within the seed noise.", "",
              "| family | T range | points | a ± se | b ± se | χ²/dof (log law) | e ± se | χ²/dof (power law) | C | "
              "χ²/dof (T_eff log T) | log law − power law at the largest T (in se of that point) |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for fam in fams:
        for cut in ([None, 20] if fam["T"] and max(fam["T"]) > 20 else [None]):
            idx = [j for j, T in enumerate(fam["T"]) if cut is None or T <= cut]
            if len(idx) < 3:
                continue
            te = np.array([fam["t_eff"][j] for j in idx])
            N = np.array([fam["N"][j] for j in idx])
            se = np.array([fam["se"][j] for j in idx])
            Tv = np.array([fam["T"][j] for j in idx], dtype=float)
            f = fit_n_min_laws(te, N, se, T=Tv)
            L, P, C = f["log_law"], f["power_law"], f["paper"]
            j = int(np.argmax(te))
            diff = (L["a"] + L["b"] * math.log(te[j])) - P["c"] * te[j] ** P["e"]
            lines.append(f"| {fam['name']} | {int(Tv.min())}–{int(Tv.max())} | {len(idx)} | {L['a']:.1f} ± {L['se_a']:.1f} | "
                         f"{L['b']:.1f} ± {L['se_b']:.1f} | {L['chi2'] / L['dof']:.2f} | {P['e']:.3f} ± {P['se_e']:.3f} | "
                         f"{P['chi2'] / P['dof']:.2f} | {C['C']:.2f} | {C['chi2'] / C['dof']:.2f} | "
                         f"{diff / (N[j] * se[j]):+.2f} |")
        if fam["N"]:
            ax.errorbar(fam["t_eff"], fam["N"], yerr=np.array(fam["N"]) * np.array(fam["se"]), fmt="o-", ms=3,
                        capsize=2, label=fam["name"])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("T_eff")
    ax.set_ylabel(f"N_{RECOVERY_LEVEL} (probit)")
    ax.legend(fontsize=6)
    save_figure(fig, os.path.join(ARGS.out, "recovery_nmin.png"))
    return lines


def main():
    global ARGS
    p = parser(__doc__, "examples_out/finite_samples", quick_help="small sweeps (smoke test)")
    p.add_argument("--cases", default=",".join(RECOVERY_FAMILIES),
                   help=f"section 4's families, a comma-separated subset of {','.join(RECOVERY_FAMILIES)}")
    p.add_argument("--recovery-T", default="", help="section 4 at these T instead (comma-separated integers)")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated subset of {','.join(SECTIONS)} (default: all)")
    ARGS = p.parse_args()
    chosen = [x.strip() for x in ARGS.sections.split(",") if x.strip()]
    bad = [x for x in chosen if x not in SECTIONS]
    if bad or not chosen:
        p.error(f"--sections: unknown section(s) {', '.join(bad) or '(none given)'}; choose from {','.join(SECTIONS)}")
    try:
        ARGS.recovery_T = [int(x) for x in ARGS.recovery_T.split(",") if x.strip()]
    except ValueError:
        p.error(f"--recovery-T: expected comma-separated integers, got {ARGS.recovery_T!r}")
    if any(T < 3 for T in ARGS.recovery_T):
        p.error("--recovery-T: every T must be >= 3")
    bad = [x for x in ARGS.cases.split(",") if x not in RECOVERY_FAMILIES]
    if bad:
        p.error(f"--cases: unknown famil(ies) {', '.join(bad)}; choose from {','.join(RECOVERY_FAMILIES)}")
    ensure_out(ARGS.out)
    t0 = time.perf_counter()
    lines = ["# Finite samples, exactly (examples/finite_samples.py" + (" --quick" if ARGS.quick else "") +
             ("" if len(chosen) == len(SECTIONS) else f" --sections {','.join(chosen)}") +
             ("" if ARGS.cases == ",".join(RECOVERY_FAMILIES) else f" --cases {ARGS.cases}") +
             (f" --recovery-T {','.join(map(str, ARGS.recovery_T))}" if ARGS.recovery_T else "") + ")", ""]
    for name in chosen:
        fn, fname = SECTIONS[name]
        n0 = len(lines)
        fn(ARGS.quick, lines)
        body = lines[n0:] if n0 > 2 else lines
        _write_atomic(os.path.join(ARGS.out, fname), "\n".join(body) + "\n")
    print("\n".join(lines))
    print(f"\ntotal {time.perf_counter() - t0:.1f} s; written: {', '.join(sorted(os.listdir(ARGS.out)))}")


#: The sections, their functions and table files, in order.
SECTIONS = {"nmin": (nmin_section, "nmin_table.md"), "sgd": (sgd_section, "sgd_table.md"),
            "fraction": (fraction_section, "stage1_fraction.md"), "recovery": (recovery_section, "recovery_table.md")}


def _write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
