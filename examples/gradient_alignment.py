"""Exact vs idealized Stage-1 gradient
===================================

Exact vs idealized Stage-1 gradient at initialization (DESIGN §5).

At ``A1 = 0``, ``A2 = β0·I`` (``β0 = 1e-6``), compares the exact population
``dA1`` (:func:`popgrad.exact.exact_loss_and_grad`, enumeration, default
``ε = T_eff^{-1/2}``) with the idealized prediction
``-(β0/(S·T)) J(P_i) g_i`` (:func:`popgrad.idealized_grad_A1`) on the chain
graph with a symmetrized Dirichlet(1) prior (8 draws × S! relabelings).

Columns: cosine over all entries; cosine without the query row ``T-1``;
cosine when the idealized query row is the first-order expansion
(``query_row="first_order"``); whether the parent entries ``(i, i-1)`` agree
in sign. Prints a markdown table; ``--markdown PATH`` also writes it.
"""
import argparse
import os
import time

import numpy as np

import popgrad as pg
from popgrad._io import atomic_write_text
from popgrad import exact_loss_and_grad
from popgrad import idealized_grad_A1

HEADER = ("| S | T | T_eff | ε | cos | cos (rows < T-1) | cos (first-order query row) "
          "| parent signs agree | exact time (s) |\n|---|---|---|---|---|---|---|---|---|")


def cosine(a, b) -> float:
    """``⟨a, b⟩ / (‖a‖ ‖b‖)`` over all entries."""
    return float(np.sum(a * b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def alignment_row(S, T, beta0=1e-6, alpha=1.0, n_atoms=8, seed=0):
    """One row of the table: ``(S, T, T_eff, eps, cos, cos_no_query, cos_first_order, signs, seconds)``."""
    task = pg.Task(pg.chain(T), pg.dirichlet_prior(S, alpha, n_atoms, seed))
    A1 = np.zeros((T, T))
    t0 = time.perf_counter()
    exact = exact_loss_and_grad(task, A1, beta0 * np.eye(S)).dA1
    seconds = time.perf_counter() - t0
    ideal = idealized_grad_A1(task, A1, beta0)
    ideal_fo = idealized_grad_A1(task, A1, beta0, query_row="first_order")
    i = np.arange(1, T - 1)
    signs = bool(np.array_equal(np.sign(exact[i, i - 1]), np.sign(ideal[i, i - 1])))
    return (S, T, task.t_eff, task.default_eps, cosine(exact, ideal), cosine(exact[:-1], ideal[:-1]),
            cosine(exact, ideal_fo), signs, seconds)


def table(cases, beta0=1e-6) -> str:
    lines = [HEADER]
    for S, Ts in cases:
        for T in Ts:
            S_, T_, te, eps, c, c_nq, c_fo, signs, sec = alignment_row(S, T, beta0)
            lines.append(f"| {S_} | {T_} | {te:g} | {eps:.3f} | {c:.4f} | {c_nq:.4f} | {c_fo:.4f} "
                         f"| {'yes' if signs else 'NO'} | {sec:.2f} |")
            print(lines[-1], flush=True)
    return "\n".join(lines)


def plot(text, path):
    """Cosine against T for each S, from the markdown table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from popgrad.app.plots import save_figure

    rows = [r.split("|")[1:-1] for r in text.splitlines()[2:]]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for S in sorted({int(r[0]) for r in rows}):
        pts = [(int(r[1]), float(r[4])) for r in rows if int(r[0]) == S]
        ax.plot(*zip(*pts), marker="o", label=f"S = {S}")
    ax.set_xlabel("T (chain graph, T_eff = T)")
    ax.set_ylabel("cos(exact dA1, idealized)")
    ax.legend()
    save_figure(fig, path)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--beta0", type=float, default=1e-6)
    p.add_argument("--max-T3", type=int, default=12, help="largest T for S = 3")
    p.add_argument("--max-T2", type=int, default=18, help="largest T for S = 2")
    p.add_argument("--markdown", default=None, help="also write the table to this file (atomically)")
    p.add_argument("--out", default=None, help="folder for the table (gradient_alignment.md) and its figure")
    p.add_argument("--quick", action="store_true", help="T up to 8 (S = 3) and 10 (S = 2): a smoke test")
    args = p.parse_args()
    if args.quick:
        args.max_T3, args.max_T2 = min(args.max_T3, 8), min(args.max_T2, 10)
    print(HEADER)
    text = table([(3, range(4, args.max_T3 + 1)), (2, range(4, args.max_T2 + 1))], args.beta0)
    if args.markdown:
        atomic_write_text(args.markdown, text + "\n")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        atomic_write_text(os.path.join(args.out, "gradient_alignment.md"), text + "\n")
        plot(text, os.path.join(args.out, "gradient_alignment.png"))


if __name__ == "__main__":
    main()
