"""Induction head
==============

Induction head, exactly: a Markov chain in context (paper §2.3, Figure 2).

Positions 0..T-2 form one Markov chain; the query T-1 asks for π(· | s_{T-1}).
Stage 1 should make every position attend to its predecessor (the previous-
token head), Stage 2 grows A2 along the identity (the induction head).
"""
import popgrad as pg

from _common import ensure_out, parser, train_check_and_plot


def main():
    args = parser(__doc__, "examples_out/induction_head").parse_args()
    out = ensure_out(args.out)
    task = pg.Task(pg.chain(10), pg.dirichlet_prior(3, 1.0, 8, seed=0))
    train_check_and_plot(task, out, quick=args.quick)


if __name__ == "__main__":
    main()
