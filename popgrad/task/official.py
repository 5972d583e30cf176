"""The graphs of the official experiments, as data (``official_dags.json`` beside this module).

The official code draws its graphs with JAX's random stream, which NumPy cannot replay, so popgrad stores
them: Figure 9's twenty graphs (``many_graphs.ipynb``: ``rng = RNG(0)``, ``keys = rng.next(20)``, one
``get_random_DAG(key, p=0.5)`` per key, ``seq_len = 20``) and Figure 2's three (``single_parent.py``:
``chain``, ``icl`` and ``random``, the last drawn by ``RNG(seed=0)``). ``tests/task/test_official_dags.py``
regenerates them with JAX (threefry, ``jax_threefry_partitionable`` off, as the official runs had it) when
JAX is installed. The file also holds what the notebook printed per Figure 9 graph (its ``deltas``, rows
``1 … T-2``, and their mean over the graph's edges), read by :func:`figure9_notebook_values`.
"""
import json
from importlib import resources

from .graphs import CausalGraph

__all__ = ["official_dags", "figure9_notebook_values"]

EXPERIMENTS = ("figure9", "figure2")
_DATA = None


def _data() -> dict:
    global _DATA
    if _DATA is None:
        with resources.files(__package__).joinpath("official_dags.json").open("r", encoding="utf-8") as fh:
            _DATA = json.load(fh)
    return _DATA


def _experiment(experiment) -> dict:
    if not isinstance(experiment, str) or experiment not in EXPERIMENTS:
        raise ValueError(f"official_dags: unknown experiment {experiment!r}; use 'figure9' (the notebook's 20 "
                         f"graphs) or 'figure2' (chain, icl, random)")
    return _data()[experiment]


def official_dags(experiment: str) -> tuple:
    """The causal graphs an official experiment trained on, in the official order.

    Parameters
    ----------
    experiment : {"figure9", "figure2"}
        ``"figure9"``: the 20 graphs of ``many_graphs.ipynb`` (S = 3, T = 20; each position ``1 … T-2`` a
        root with probability 1/2, else a uniform earlier parent), in the notebook's order. ``"figure2"``:
        the three graphs of ``single_parent.py`` (S = 10, T = 20): ``chain``, ``icl`` and the ``random``
        graph its ``RNG(seed=0)`` draws, in that order.

    Returns
    -------
    tuple of CausalGraph
        T = 20 each (the official ``dag`` of length ``T - 1`` plus the query, a root).

    Examples
    --------
    >>> import popgrad as pg
    >>> len(pg.official_dags("figure9"))
    20
    >>> chain, icl, rnd = pg.official_dags("figure2")
    >>> rnd.to_string()
    '-1,-1,1,-1,-1,4,-1,5,3,4,8,6,1,3,5,-1,6,1,3,-1'
    """
    return tuple(CausalGraph.from_string(g["graph"]) for g in _experiment(experiment)["graphs"])


def figure9_notebook_values() -> list:
    """What ``many_graphs.ipynb`` printed per Figure 9 graph, in order.

    One dict per graph: ``index``, ``graph`` (the parents string), ``deltas`` (the printed
    ``Σ_j (A - softmax(MASK(Ã1[S:, S:]))) ⊙ A`` per row ``1 … T-2``, float32 as printed; 0 at a root),
    ``mean_delta`` (the printed ``Σ deltas / edges``) and ``official`` = ``1 - mean_delta``, the graph's
    mean positional attention to the parent, the quantity the notebook averages over graphs (0.837 ± 0.054).
    """
    out = []
    for g in _experiment("figure9")["graphs"]:
        out.append({"index": g["index"], "graph": g["graph"], "deltas": list(g["notebook_deltas"]),
                    "mean_delta": g["notebook_mean_delta"], "official": 1.0 - g["notebook_mean_delta"]})
    return out
