"""The exact stability study of ``catformer_symmetry.py`` (DESIGN §22): its ``--stability``, ``--plateaus``,
``--sweep``, ``--curvature``, ``--basin``, ``--study`` and ``--long`` modes (tables in docs/symmetry_breaking.md)."""
import time

import numpy as np

import popgrad as pg
from popgrad.checks import catformer as cc

from _catformer import two_parent_task, write


# ============================================================ the exact stability study (DESIGN §22)
def prior_words(args):
    """The prior of ``--prior`` in words (the tables' captions)."""
    if args.prior == "continuous":
        return f"continuous DirichletTensorPrior(S, 2, {args.alpha:g}) (the official task; roots uniform)"
    return (f"finite prior: 16 Dirichlet({args.alpha:g}) tensors closed under parent and token relabelings "
            "(exact for it)")


def stability_run(task, optimizer, steps, epsilon=1e-8, seed=0, spectrum_every=None, lr=None):
    """One exact run from the symmetric start (heads (2, 1)) with its linearisation, spectra and read-outs."""
    from popgrad.checks import symmetry_breaking as sb

    model = pg.CatFormer(task.S, task.T, heads=(2, 1))
    start = sb.symmetric_start(model, 1e-4, seed, epsilon)
    if optimizer == "adamw":
        lr, sched, wd = (1e-2 if lr is None else lr), "cosine", 1e-4
    else:
        lr, sched, wd = (1.0 if lr is None else lr), "cosine", 0.0
    t0 = time.perf_counter()
    run = sb.follow_symmetric_start(task, model, start, steps, optimizer=optimizer, lr=lr, lr_schedule=sched,
                                    weight_decay=wd, spectrum_every=spectrum_every)
    secs = time.perf_counter() - t0
    marg = sb.positional_margins(task, model, run.final)
    abl = sb.head_ablation(task, model, run.final)
    M = cc.slot_attention(task.graph, cc.population_attention(task, model, run.final))
    return dict(run=run, margins=marg, ablation=abl, M=M, secs=secs, lr=lr, sched=sched, wd=wd, eps=epsilon)


def holds_until(run, tol=0.1):
    """Last step through which the linearisation's relative error stays below ``tol``."""
    bad = np.flatnonzero(~(run.err_lin < tol))
    return int(run.step[-1]) if bad.size == 0 else int(run.step[max(bad[0] - 1, 0)])


def stability_rows(S, T, res, optimizer, steps):
    run, abl, marg = res["run"], res["ablation"], res["margins"]
    q = [t for t in (0, 1, 2, 10, 100, 1000, steps) if t <= steps]
    q = sorted(set(q))
    i_min = int(np.argmin(run.lam_min))
    pe = run.pref_eig[-1]
    pd = run.pref_delta[-1]
    row = (f"| {S} | {T} | {optimizer} {res['lr']:g} {res['sched']} | {steps} | {res['eps']:.0e} | "
           f"{run.lam_min[0]:+.3g} / {run.lam_min[i_min]:+.3g} (step {int(run.spec_step[i_min])}) / "
           f"{run.lam_min[-1]:+.3g} | "
           + (f"{run.plam_min[0]:+.3g} / {np.nanmin(run.plam_min):+.3g} / {run.plam_min[-1]:+.3g} | "
              if optimizer == "adamw" else "- | ")
           + f"{run.unstable_step()} | " + ", ".join(f"{run.delta[t]:.2e}" for t in q) + " | "
           + ", ".join(f"{run.err_lin[t]:.1e}" for t in q) + f" | {holds_until(run)} | "
           f"{pd[0]:+.2g} / {pe[0]:+.2g} | {run.loss[-1]:.4f} | "
           f"{np.array2string(res['M'], precision=2, separator=',').replace(chr(10), '')} | "
           f"{np.array2string(marg.preference.mean(axis=1), precision=3, separator=',')} | "
           f"{abl.loss:.4f} / {abl.ablated[0]:.4f} / {abl.ablated[1]:.4f} / {abl.both:.4f} | "
           f"{abl.one_parent[0]:.4f} / {abl.one_parent[1]:.4f} / {abl.two_parent:.4f} / {abl.bayes:.4f} | "
           f"{res['secs']:.0f} |")
    return row, q


STAB_HEADER = ("| S | T | optimizer | steps | ε | λ_min anti: start / min (step) / end | Adam-preconditioned λ_min: "
               "start / min / end | unstable from step | ‖δ‖ at steps {q} | linearisation rel. error at those "
               "steps | linearisation < 10 % through step | head 0 toward slot 0 (>0) or 1 (<0): δ / eigvec "
               "(end) | final loss | M[h, slot] population | positional preference per head (slot 0 − slot 1) | "
               "ablation: loss / head 0 off / head 1 off / both off | count refs: slot 0 / slot 1 / both "
               "(KT 1/2) / Bayes | s |")


def stability_main(args, out):
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    opts = args.optimizers.split(",")
    lines = ["Exact runs from the symmetric start (heads (2, 1), Ã ~ 1e-4·N(0,1) symmetrised, W = 0, plus an "
             f"antisymmetric perturbation of norm ε = {args.epsilon:g}); two-parent graph, {prior_words(args)}.", ""]
    rows = []
    for S, T in sizes:
        task = two_parent_task(S, T, alpha=args.alpha, prior=args.prior)
        for opt in opts:
            steps = args.stab_steps
            res = stability_run(task, opt, steps, epsilon=args.epsilon, spectrum_every=max(1, steps // 8))
            row, q = stability_rows(S, T, res, opt, steps)
            rows.append(row)
            print(row, flush=True)
            np.savez(f"{out}/stability_S{S}_T{T}_{opt}.npz", **{k: np.asarray(v) for k, v in
                                                               res["run"]._asdict().items()
                                                               if k not in ("final", "optimizer")})
    lines += [STAB_HEADER.replace("{q}", ", ".join(map(str, q))), "|" + "---|" * (STAB_HEADER.count("|") - 1)]
    lines += rows
    lines += ["", f"Reproduce: python examples/catformer_symmetry.py --stability --sizes {args.sizes} "
                  f"--optimizers {args.optimizers} --stab-steps {args.stab_steps} --epsilon {args.epsilon:g} "
                  f"--alpha {args.alpha:g} --prior {args.prior}"]
    write(out, "stability_table.md", "\n".join(lines))


def plateau_main(args, out):
    """GD escape from the first plateau against the learning rate, with the Hessian's extreme eigenvalues there."""
    from popgrad.checks import symmetry_breaking as sb

    S, T = [int(x) for x in args.sizes.split(",")[0].split("x")]
    task = two_parent_task(S, T, alpha=args.alpha, prior=args.prior)
    model = pg.CatFormer(S, T, heads=(2, 1))
    start = sb.symmetric_start(model, 1e-4, 0, args.epsilon)
    lines = [f"Plateaus of GD (constant lr) from the symmetric start, S = {S}, T = {T}, two-parent, "
             f"alpha = {args.alpha:g}, ε = {args.epsilon:g}. Rule: step t is flat when the loss drops by less than "
             "1e-3 of the run's total drop over the next w = max(5, steps/50) steps; a plateau is a run of ≥ w "
             "flat steps (the last, reaching the end, is convergence).", "",
             "| lr | steps | plateaus (start-stop: loss) | first non-final plateau: escape step × lr | "
             "λ_min / λ_max of H there | λ_min / λ_max of H_anti there |", "|---|---|---|---|---|---|"]
    for lr in [float(x) for x in args.lrs.split(",")]:
        steps = int(round(args.stab_steps / lr))
        traj = pg.train_catformer(task, model, steps, optimizer="gd", lr=lr, lr_schedule="constant", init=start,
                                  record_every=1)
        pl = sb.find_plateaus(traj.loss)
        first = next((p for p in pl if not p.final), None)
        if first is not None:
            mid = traj.params((first.start + first.stop) // 2)
            full = pg.hessian_spectrum(task, model, mid, k=1)
            anti = pg.hessian_spectrum(task, model, mid, k=1, subspace="head_antisymmetric")
            extra = (f"{first.stop} × {lr:g} = {first.stop * lr:.0f} | {full.values[0]:+.3g} / {full.values[-1]:+.3g} | "
                     f"{anti.values[0]:+.3g} / {anti.values[-1]:+.3g}")
        else:
            extra = "- | - | -"
        desc = "; ".join(f"{p.start}-{p.stop}: {p.loss:.4f}{' (final)' if p.final else ''}" for p in pl)
        lines.append(f"| {lr:g} | {steps} | {desc} | {extra} |")
        print(lines[-1], flush=True)
    lines += ["", f"Reproduce: python examples/catformer_symmetry.py --plateaus --sizes {S}x{T} --lrs {args.lrs} "
                  f"--stab-steps {args.stab_steps} --epsilon {args.epsilon:g} --alpha {args.alpha:g} --prior {args.prior}"]
    write(out, "plateau_table.md", "\n".join(lines))


def block_shares(model, x):
    """Share of ``‖x‖²`` in: layer-1 positional blocks ``Ã^(1)_h[S:, S:]``, the rest of layer 1, layer 2, ``W``."""
    from popgrad.engine import hvp as H

    p = H.unflatten_params(model, x)
    S = model.S
    pos = float(np.sum(p.A[0][:, S:, S:] ** 2))
    l1 = float(np.sum(p.A[0] ** 2)) - pos
    l2 = float(sum(np.sum(a ** 2) for a in p.A[1:]))
    w = float(np.sum(p.W ** 2))
    tot = pos + l1 + l2 + w
    return np.array([pos, l1, l2, w]) / tot


def sweep_main(args, out):
    """Per size: GD and AdamW from the symmetric start; the antisymmetric spectrum at GD's end; read-outs."""
    from popgrad.checks import symmetry_breaking as sb
    from popgrad.engine import hvp as H

    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    steps = args.stab_steps
    head = ("| S | T | sequences | GD: final loss | GD: ‖δ‖ start → end | GD end: λ_min / λ_max of H_anti | "
            "eigvec share: L1 positional / L1 other / layer 2 / W | eigvec head-0 preference (slot 0 − slot 1 "
            "logit) | AdamW: final loss | AdamW: ‖δ‖ at 1, 10, 100, end | AdamW: M[h, slot] | AdamW: positional "
            "preference per head | AdamW ablation: loss / head 0 off / head 1 off / both off | count refs slot 0 "
            "/ slot 1 / both / Bayes | split? | s |")
    lines = [f"GD (lr 1 cosine) and AdamW (lr 1e-2 cosine, wd 1e-4) for {steps} exact steps from the symmetric start "
             f"(ε = {args.epsilon:g}, Ã ~ 1e-4 symmetrised, W = 0), heads (2, 1), two-parent graph, "
             f"{prior_words(args)}. Spectra by "
             "Lanczos (tol 1e-6) at the GD end point's symmetric part.", "", head, "|" + "---|" * (head.count("|") - 1)]
    for S, T in sizes:
        t0 = time.perf_counter()
        task = two_parent_task(S, T, alpha=args.alpha, prior=args.prior)
        model = pg.CatFormer(S, T, heads=(2, 1))
        start = sb.symmetric_start(model, 1e-4, 0, args.epsilon)
        gd = pg.train_catformer(task, model, steps, optimizer="gd", lr=1.0, lr_schedule="cosine", init=start,
                                record_every=steps)
        d_gd = [np.linalg.norm(sb.antisymmetric_part(model, gd.params(r))) for r in (0, -1)]
        x = H.flatten_params(gd.final)
        perm = H.head_swap(model)
        pbar = H.unflatten_params(model, (x + x[perm]) / 2)
        sp = pg.hessian_spectrum(task, model, pbar, k=1, subspace="head_antisymmetric", tol=1e-6)
        vec = sp.vectors[:, 0]
        shares = block_shares(model, vec)
        pref = sb.parent_preference(task, model, vec)
        ad = pg.train_catformer(task, model, steps, optimizer="adamw", lr=1e-2, lr_schedule="cosine",
                                weight_decay=1e-4, init=start, record_every=1)
        q = sorted({t for t in (1, 10, 100, steps) if t <= steps})
        d_ad = [np.linalg.norm(sb.antisymmetric_part(model, ad.params(t))) for t in q]
        M = cc.slot_attention(task.graph, cc.population_attention(task, model, ad.final))
        mg = sb.positional_margins(task, model, ad.final)
        ab = sb.head_ablation(task, model, ad.final)
        prefs = mg.preference.mean(axis=1)
        split = bool(prefs[0] * prefs[1] < 0 and cc.soft_split(M))
        lines.append(
            f"| {S} | {T} | {task.n_sequences} | {gd.loss[-1]:.4f} | {d_gd[0]:.2e} → {d_gd[1]:.2e} | "
            f"{sp.values[0]:+.4g} / {sp.values[-1]:+.4g} | {' / '.join(f'{v:.2f}' for v in shares)} | "
            f"{pref[0]:+.2g} | {ad.loss[-1]:.4f} | {', '.join(f'{v:.2e}' for v in d_ad)} | "
            f"{np.array2string(M, precision=2, separator=',').replace(chr(10), '')} | "
            f"{np.array2string(prefs, precision=3, separator=',')} | "
            f"{ab.loss:.4f} / {ab.ablated[0]:.4f} / {ab.ablated[1]:.4f} / {ab.both:.4f} | "
            f"{ab.one_parent[0]:.4f} / {ab.one_parent[1]:.4f} / {ab.two_parent:.4f} / {ab.bayes:.4f} | "
            f"{'yes' if split else 'no'} | {time.perf_counter() - t0:.0f} |")
        print(lines[-1], flush=True)
    lines += ["", "split? = the two heads' mean positional preferences have opposite signs and M (population) "
                  "prefers distinct slots.",
              f"Reproduce: python examples/catformer_symmetry.py --sweep --sizes {args.sizes} --stab-steps {steps} "
              f"--epsilon {args.epsilon:g} --alpha {args.alpha:g} --prior {args.prior}"]
    write(out, "sweep_table.md", "\n".join(lines))


def split_direction(task, model):
    """The unit antisymmetric direction that points head 0's positional block at slot 0 and head 1's at slot 1.

    ``Ã^(1)_0[S:, S:] += adjacency(0) − adjacency(1)``, ``Ã^(1)_1[S:, S:] −= the same`` (antisymmetric under the
    swap of the two layer-1 heads), every other block zero, normalised.
    """
    from popgrad.engine import hvp as H

    d = model.zeros()
    S = model.S
    D = task.graph.adjacency(0) - task.graph.adjacency(1)
    d.A[0][0, S:, S:] = D
    d.A[0][1, S:, S:] = -D
    x = H.flatten_params(d)
    return x / np.linalg.norm(x)


def curvature_main(args, out):
    """Curvature of the parent-split direction at GD's (symmetric) end point, against the antisymmetric λ_min."""
    from popgrad.checks import symmetry_breaking as sb
    from popgrad.engine import hvp as H

    steps = args.stab_steps
    lines = [f"Curvature u·H·u of the unit parent-split direction u (head 0's positional block toward slot 0, head 1's "
             f"toward slot 1, antisymmetric) at the end of GD (lr 1 cosine, {steps} exact steps from the symmetric "
             f"start, ε = {args.epsilon:g}), two-parent, {prior_words(args)}, heads (2, 1).", "",
             "| S | T | GD final loss | u·H·u | ‖P_anti H u‖ / ‖H u‖ | loss(θ̄ + t u) − loss(θ̄), t = 0.5, 1, 2 | s |",
             "|---|---|---|---|---|---|---|"]
    for S, T in [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]:
        t0 = time.perf_counter()
        task = two_parent_task(S, T, alpha=args.alpha, prior=args.prior)
        model = pg.CatFormer(S, T, heads=(2, 1))
        gd = pg.train_catformer(task, model, steps, optimizer="gd", lr=1.0, lr_schedule="cosine",
                                init=sb.symmetric_start(model, 1e-4, 0, args.epsilon), record_every=steps)
        x = H.flatten_params(gd.final)
        perm = H.head_swap(model)
        xb = (x + x[perm]) / 2
        u = split_direction(task, model)
        hu = H.flatten_params(pg.catformer_hvp(task, model, H.unflatten_params(model, xb), H.unflatten_params(model, u)))
        anti = np.linalg.norm((hu - hu[perm]) / 2) / np.linalg.norm(hu)
        L0 = pg.catformer_loss(task, model, H.unflatten_params(model, xb))
        dl = [pg.catformer_loss(task, model, H.unflatten_params(model, xb + t * u)) - L0 for t in (0.5, 1.0, 2.0)]
        lines.append(f"| {S} | {T} | {gd.loss[-1]:.4f} | {u @ hu:+.4g} | {anti:.3f} | "
                     + ", ".join(f"{v:+.3g}" for v in dl) + f" | {time.perf_counter() - t0:.0f} |")
        print(lines[-1], flush=True)
    lines += ["", f"Reproduce: python examples/catformer_symmetry.py --curvature --sizes {args.sizes} "
                  f"--stab-steps {steps} --epsilon {args.epsilon:g} --alpha {args.alpha:g} --prior {args.prior}"]
    write(out, "curvature_table.md", "\n".join(lines))


def basin_main(args, out):
    """GD from GD's symmetric end point plus ``t`` units of the parent-split direction: does the split persist?"""
    from popgrad.checks import symmetry_breaking as sb
    from popgrad.engine import hvp as H

    offsets = [float(x) for x in args.offsets.split(",")]
    steps = args.stab_steps
    lines = [f"GD (lr 1 cosine, 1024 steps) from the symmetric start to θ̄, then GD lr 1 constant for {steps} steps "
             "from θ̄ + t·u (u: unit parent-split direction, `split_direction`); two-parent, "
             f"{prior_words(args)}, heads (2, 1).", "",
             "| S | T | t | loss at θ̄ + t·u → end | ‖δ‖ at records | positional preference per head (slot 0 − slot 1) "
             "at records | M[h, slot] population (end) | status | s |", "|---|---|---|---|---|---|---|---|---|"]
    for S, T in [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]:
        task = two_parent_task(S, T, alpha=args.alpha, prior=args.prior)
        model = pg.CatFormer(S, T, heads=(2, 1))
        gd = pg.train_catformer(task, model, 1024, optimizer="gd", lr=1.0, lr_schedule="cosine",
                                init=sb.symmetric_start(model, 1e-4, 0, args.epsilon), record_every=1024)
        x = H.flatten_params(gd.final)
        perm = H.head_swap(model)
        xb = (x + x[perm]) / 2
        u = split_direction(task, model)
        for t in offsets:
            t0 = time.perf_counter()
            tr = pg.train_catformer(task, model, steps, optimizer="gd", lr=1.0, lr_schedule="constant",
                                    init=H.unflatten_params(model, xb + t * u), record_every=max(1, steps // 4))
            prefs = [sb.positional_margins(task, model, tr.params(r)).preference.mean(axis=1)
                     for r in range(len(tr.step))]
            dn = [np.linalg.norm(sb.antisymmetric_part(model, tr.params(r))) for r in range(len(tr.step))]
            M = cc.slot_attention(task.graph, cc.population_attention(task, model, tr.final))
            lines.append(f"| {S} | {T} | {t:g} | {tr.loss[0]:.4f} → {tr.loss[-1]:.4f} | "
                         + ", ".join(f"{d:.3g}" for d in dn) + " | "
                         + "; ".join(np.array2string(p, precision=3, separator=",") for p in prefs)
                         + f" | {np.array2string(M, precision=2, separator=',').replace(chr(10), '')} | "
                         f"{tr.status} at step {int(tr.step[-1])} | {time.perf_counter() - t0:.0f} |")
            print(lines[-1], flush=True)
    lines += ["", f"Reproduce: python examples/catformer_symmetry.py --basin --sizes {args.sizes} --offsets "
                  f"{args.offsets} --stab-steps {steps} --epsilon {args.epsilon:g} --alpha {args.alpha:g} --prior {args.prior}"]
    write(out, "basin_table.md", "\n".join(lines))


#: The study's arms: (label, optimizer, lr, weight decay, gradient); every one cosine from the symmetric start.
ARMS = {"gd": ("gd", 1.0, 0.0, "exact"), "adamw": ("adamw", 1e-2, 1e-4, "exact"),
        "sgd-sampled": ("sgd", 1.0, 0.0, "sampled"), "adamw-sampled": ("adamw", 1e-2, 1e-4, "sampled")}

STUDY_HEADER = ("| S | T | arm | λ_min of H_anti at steps {spec} | min λ_min (step) | Adam-preconditioned λ_min at "
                "those steps | unstable from step | ‖δ‖ at steps {q} | linearisation: max rel. error over steps "
                "1–{lin} / < 10 % through step | δ/‖δ‖'s head-0 preference (slot 0 − slot 1 logit): step {lin}, end | "
                "eigvec head-0 preference (end) | u·H·u (split direction, end) | exact loss: start → end | "
                "M[h, slot] population | positional preference per head | ablation: loss / head 0 off / head 1 off / "
                "both off | split? | s |")


def study_row(task, model, arm, args):
    """One arm of the official-task study: the followed run, its spectra, linearisation and read-outs."""
    from popgrad.checks import symmetry_breaking as sb
    from popgrad.engine import hessian as Hs
    from popgrad.engine import hvp as H

    opt, lr, wd, gradient = ARMS[arm]
    steps, lin = args.stab_steps, min(args.lin_steps, args.stab_steps)
    spec = sorted({t for t in (0, lin, steps) if t <= steps})
    t0 = time.perf_counter()
    start = sb.symmetric_start(model, 1e-4, 0, args.epsilon)
    run = sb.follow_symmetric_start(task, model, start, steps, optimizer=opt, lr=lr, lr_schedule="cosine",
                                    weight_decay=wd, spectrum_steps=spec, spectrum_tol=1e-5, gradient=gradient,
                                    batch_size=args.batch_size, sample_seed=0, linearize_until=lin)
    x = H.flatten_params(run.final)
    perm = Hs.head_swap(model)
    xb = (x + x[perm]) / 2
    u = split_direction(task, model)
    uhu = float(u @ H.flatten_params(pg.catformer_hvp(task, model, H.unflatten_params(model, xb),
                                                      H.unflatten_params(model, u))))
    M = cc.slot_attention(task.graph, cc.population_attention(task, model, run.final))
    prefs = sb.positional_margins(task, model, run.final).preference.mean(axis=1)
    ab = sb.head_ablation(task, model, run.final)
    split = bool(prefs[0] * prefs[1] < 0 and cc.soft_split(M))
    q = sorted({t for t in (0, 1, 2, 10, 100, lin, steps) if t <= steps})
    err = run.err_lin[1:lin + 1]
    bad = np.flatnonzero(~(err < 0.1))
    through = lin if bad.size == 0 else int(bad[0])  # err_lin[1 + j] fails first at step 1 + j
    i_min = int(np.argmin(run.lam_min))
    adam = opt == "adamw"
    row = (f"| {task.S} | {task.T} | {arm} | " + ", ".join(f"{v:+.3g}" for v in run.lam_min)
           + f" | {run.lam_min[i_min]:+.3g} ({int(run.spec_step[i_min])}) | "
           + (", ".join(f"{v:+.3g}" for v in run.plam_min) if adam else "–")
           + f" | {run.unstable_step()} | " + ", ".join(f"{run.delta[t]:.3g}" for t in q)
           + f" | {np.nanmax(err):.2g} / {through} | {run.pref_delta[lin][0] / run.delta[lin]:+.2g}, "
           f"{run.pref_delta[-1][0] / run.delta[-1]:+.2g} | "
           f"{run.pref_eig[-1][0]:+.2g} | {uhu:+.3g} | {run.loss[0]:.4f} → {run.loss[-1]:.4f} | "
           f"{np.array2string(M, precision=2, separator=',').replace(chr(10), '')} | "
           f"{np.array2string(prefs, precision=3, separator=',')} | "
           f"{ab.loss:.4f} / {ab.ablated[0]:.4f} / {ab.ablated[1]:.4f} / {ab.both:.4f} | "
           f"{'yes' if split else 'no'} | {time.perf_counter() - t0:.0f} |")
    refs = (ab.one_parent, ab.two_parent, ab.bayes)
    return row, run, spec, q, lin, refs


def study_main(args, out):
    """The official task (continuous prior) at enumerable sizes: GD, AdamW, SGD and AdamW on sampled batches."""
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise SystemExit(f"--arms: unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ARMS)}")
    lines = [f"Exact runs from the symmetric start (heads (2, 1), Ã ~ 1e-4·N(0,1) symmetrised, W = 0, plus a random "
             f"antisymmetric perturbation of norm ε = {args.epsilon:g}), {args.stab_steps} cosine steps; two-parent "
             f"graph, {prior_words(args)}. Arms: gd (lr 1), adamw (lr 1e-2, wd 1e-4), sgd-sampled (lr 1, batches of "
             f"{args.batch_size}, seed 0), adamw-sampled (the official recipe on batches of {args.batch_size}). "
             "λ's: the population Hessian's antisymmetric block at the symmetric part θ̄_t (Lanczos, tol 1e-5); "
             "sampled arms' linearisation uses each step's batch Hessian.", ""]
    rows, refs_lines, head = [], [], None
    for S, T in sizes:
        task = two_parent_task(S, T, alpha=args.alpha, prior=args.prior)
        model = pg.CatFormer(S, T, heads=(2, 1))
        for arm in arms:
            row, run, spec, q, lin, refs = study_row(task, model, arm, args)
            head = head or (spec, q, lin)
            rows.append(row)
            print(row, flush=True)
            np.savez(f"{out}/study_S{S}_T{T}_{arm}.npz", **{k: np.asarray(v) for k, v in run._asdict().items()
                                                            if k not in ("final", "optimizer")})
        one, two, bayes = refs
        refs_lines.append(f"| {S} | {T} | {task.n_sequences} | {one[0]:.4f} | {one[1]:.4f} | {two:.4f} | {bayes:.4f} |")
    spec, q, lin = head
    h = (STUDY_HEADER.replace("{spec}", ", ".join(map(str, spec))).replace("{q}", ", ".join(map(str, q)))
         .replace("{lin}", str(lin)))
    lines += [h, "|" + "---|" * (h.count("|") - 1)] + rows
    lines += ["", "Count references (Krichevsky–Trofimov add-½ in-context estimators, exact) and the Bayes loss:", "",
              "| S | T | sequences | slot 0 | slot 1 | both slots | Bayes |", "|---|---|---|---|---|---|---|"]
    lines += refs_lines
    lines += ["", "split? = the two heads' mean positional preferences have opposite signs and M (population) prefers "
                  "distinct slots. u = unit parent-split direction (`split_direction`).",
              f"Reproduce: python examples/catformer_symmetry.py --study --sizes {args.sizes} --arms {args.arms} "
              f"--stab-steps {args.stab_steps} --lin-steps {args.lin_steps} --batch-size {args.batch_size} "
              f"--epsilon {args.epsilon:g} --alpha {args.alpha:g} --prior {args.prior}"]
    write(out, "study_table.md", "\n".join(lines))


def long_main(args, out):
    """Plain GD (constant lr 1) for many exact steps from the symmetric start: does the unstable antisymmetric
    direction, once grown out of the linear regime, end in a parent split?"""
    from popgrad.checks import symmetry_breaking as sb

    steps = args.stab_steps
    lines = [f"GD (lr 1 constant) for {steps} exact steps from the symmetric start (ε = {args.epsilon:g}), two-parent, "
             f"{prior_words(args)}, heads (2, 1). ‖δ‖ and the positional preference per head at steps 0, "
             f"{steps // 8}, {steps // 4}, {steps // 2}, {steps}.", "",
             "| S | T | ‖δ‖ at those steps | growth rate per step over steps/8 … steps/4 | loss at those steps | "
             "positional preference per head (end) | M[h, slot] population (end) | split? | status | s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for S, T in [tuple(int(x) for x in s_.split("x")) for s_ in args.sizes.split(",")]:
        t0 = time.perf_counter()
        task = two_parent_task(S, T, alpha=args.alpha, prior=args.prior)
        model = pg.CatFormer(S, T, heads=(2, 1))
        tr = pg.train_catformer(task, model, steps, optimizer="gd", lr=1.0, lr_schedule="constant",
                                init=sb.symmetric_start(model, 1e-4, 0, args.epsilon), record_every=max(1, steps // 8))
        idx = [list(tr.step).index(t) for t in (0, steps // 8, steps // 4, steps // 2) if t in tr.step]
        idx.append(len(tr.step) - 1)
        dn = [float(np.linalg.norm(sb.antisymmetric_part(model, tr.params(r)))) for r in idx]
        # growth rate over steps/8 … steps/4 (still linear when ‖δ‖ is small there)
        rate = np.log(dn[2] / dn[1]) / (tr.step[idx[2]] - tr.step[idx[1]]) if len(dn) == 5 and dn[1] > 0 else float("nan")
        prefs = sb.positional_margins(task, model, tr.final).preference.mean(axis=1)
        M = cc.slot_attention(task.graph, cc.population_attention(task, model, tr.final))
        split = bool(prefs[0] * prefs[1] < 0 and cc.soft_split(M))
        lines.append(f"| {S} | {T} | " + ", ".join(f"{d:.3g}" for d in dn) + f" | {rate:+.3g} | "
                     + ", ".join(f"{tr.loss[r]:.4f}" for r in idx)
                     + f" | {np.array2string(prefs, precision=3, separator=',')} | "
                     f"{np.array2string(M, precision=2, separator=',').replace(chr(10), '')} | "
                     f"{'yes' if split else 'no'} | {tr.status} at step {int(tr.step[-1])} | "
                     f"{time.perf_counter() - t0:.0f} |")
        print(lines[-1], flush=True)
    lines += ["", f"Reproduce: python examples/catformer_symmetry.py --long --sizes {args.sizes} --stab-steps {steps} "
                  f"--epsilon {args.epsilon:g} --alpha {args.alpha:g} --prior {args.prior}"]
    write(out, "long_table.md", "\n".join(lines))
