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

Run it with ``python examples/gradient_alignment.py --out examples_out/gradient_alignment`` (``--quick``: T
up to 8 for S = 3 and 10 for S = 2).
"""

# %%
# The options
# -----------
# ``--beta0`` the second layer's scale, ``--max-T3`` / ``--max-T2`` the largest T per S, ``--out`` the folder
# for the table and its figure. In a notebook the defaults apply.
import argparse
import os
import time

import matplotlib.pyplot as plt
import numpy as np

import popgrad as pg
from popgrad.app.plots import save_figure

cli = argparse.ArgumentParser(description="Exact vs idealized Stage-1 gradient at initialization.")
cli.add_argument("--beta0", type=float, default=1e-6)
cli.add_argument("--max-T3", type=int, default=12, help="largest T for S = 3")
cli.add_argument("--max-T2", type=int, default=18, help="largest T for S = 2")
cli.add_argument("--markdown", default=None, help="also write the table to this file")
cli.add_argument("--out", default="examples_out/gradient_alignment",
                 help="folder for the table (gradient_alignment.md) and its figure")
cli.add_argument("--quick", action="store_true", help="T up to 8 (S = 3) and 10 (S = 2): a smoke test")
args, _ = cli.parse_known_args()
if args.quick:
    args.max_T3, args.max_T2 = min(args.max_T3, 8), min(args.max_T2, 10)


def write_text(path, text):
    """Write ``text`` to ``path`` whole or not at all (a temporary file renamed over it)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


# %%
# One row: the two gradients at initialization
# --------------------------------------------
# ``pg.exact_loss_and_grad`` enumerates every sequence for the exact population gradient;
# ``pg.idealized_grad_A1`` is the paper's closed-form prediction (Knowl 3). At ``A1 = 0`` they should
# point the same way, more closely as T grows.
def cosine(a, b) -> float:
    """``⟨a, b⟩ / (‖a‖ ‖b‖)`` over all entries."""
    return float(np.sum(a * b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def alignment_row(S, T, beta0=1e-6, alpha=1.0, n_atoms=8, seed=0):
    """One row of the table: ``(S, T, T_eff, eps, cos, cos_no_query, cos_first_order, signs, seconds)``."""
    task = pg.Task(pg.chain(T), pg.dirichlet_prior(S, alpha, n_atoms, seed))
    A1 = np.zeros((T, T))
    t0 = time.perf_counter()
    exact = pg.exact_loss_and_grad(task, A1, beta0 * np.eye(S)).dA1
    seconds = time.perf_counter() - t0
    ideal = pg.idealized_grad_A1(task, A1, beta0)
    ideal_fo = pg.idealized_grad_A1(task, A1, beta0, query_row="first_order")
    i = np.arange(1, T - 1)
    signs = bool(np.array_equal(np.sign(exact[i, i - 1]), np.sign(ideal[i, i - 1])))
    return (S, T, task.t_eff, task.default_eps, cosine(exact, ideal), cosine(exact[:-1], ideal[:-1]),
            cosine(exact, ideal_fo), signs, seconds)


# %%
# The table
# ---------
HEADER = ("| S | T | T_eff | ε | cos | cos (rows < T-1) | cos (first-order query row) "
          "| parent signs agree | exact time (s) |\n|---|---|---|---|---|---|---|---|---|")
print(HEADER)
lines = [HEADER]
rows = []
for S, Ts in [(3, range(4, args.max_T3 + 1)), (2, range(4, args.max_T2 + 1))]:
    for T in Ts:
        S_, T_, te, eps, c, c_nq, c_fo, signs, sec = alignment_row(S, T, args.beta0)
        rows.append((S_, T_, c))
        lines.append(f"| {S_} | {T_} | {te:g} | {eps:.3f} | {c:.4f} | {c_nq:.4f} | {c_fo:.4f} "
                     f"| {'yes' if signs else 'NO'} | {sec:.2f} |")
        print(lines[-1], flush=True)
text = "\n".join(lines)
if args.markdown:
    write_text(args.markdown, text + "\n")
os.makedirs(args.out, exist_ok=True)
write_text(os.path.join(args.out, "gradient_alignment.md"), text + "\n")

# %%
# The figure: the cosine against T
# --------------------------------
fig, ax = plt.subplots(figsize=(6, 3.6))
for S in sorted({r[0] for r in rows}):
    pts = [(T, c) for S_, T, c in rows if S_ == S]
    ax.plot(*zip(*pts), marker="o", label=f"S = {S}")
ax.set_xlabel("T (chain graph, T_eff = T)")
ax.set_ylabel("cos(exact dA1, idealized)")
ax.legend()
save_figure(fig, os.path.join(args.out, "gradient_alignment.png"))
print("figures:", ", ".join(sorted(f for f in os.listdir(args.out) if f.endswith(".png"))))
