"""In-context function learning
============================

In-context function learning, exactly: pairs (x, y = f(x)) in context (paper §2.3).

The graph is 0->1, 2->3, ...: each odd position copies the preceding even
position through π. Stage 1 should learn exactly these pair edges.
"""
import popgrad as pg

from _common import ensure_out, parser, train_check_and_plot


def main():
    args = parser(__doc__, "examples_out/icl_function").parse_args()
    out = ensure_out(args.out)
    task = pg.Task(pg.icl_pairs(11), pg.dirichlet_prior(3, 1.0, 8, seed=1, uniform_mean=True))
    train_check_and_plot(task, out, quick=args.quick)


if __name__ == "__main__":
    main()
