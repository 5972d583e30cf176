"""Shared pieces of the official-size examples (``catformer_*_official.py``): resumable sampled runs whose
partial state is readable at any time (``--table-only``)."""
import json
import os

import numpy as np

import popgrad as pg


def train_or_resume(task, model, steps, ckpt, checkpoint_every, **kw):
    """``train_catformer`` with a checkpoint; resumes (bit-identically) when ``ckpt`` exists."""
    os.makedirs(os.path.dirname(ckpt) or ".", exist_ok=True)
    return pg.train_catformer(task, model, steps, checkpoint_path=ckpt, checkpoint_every=checkpoint_every,
                              resume=os.path.exists(ckpt), **kw)


def read_checkpoint(model, ckpt):
    """``(t, params at step t, records dict)`` of a run's checkpoint (a run still going, or stopped), or ``None``."""
    if not os.path.exists(ckpt):
        return None
    with np.load(ckpt, allow_pickle=False) as z:
        meta = json.loads(str(z["meta_json"]))
        L = model.n_layers
        params = pg.CatFormerParams([np.array(z[f"A_{i + 1}"]) for i in range(L)], np.array(z["W"]))
        rec = {k[4:]: np.array(z[k]) for k in z.files if k.startswith("rec_")}
    return int(meta["t"]), params, rec, meta


def fmt_est(d, signed=False):
    if d.get("value") is None:
        return "n/a"
    return f"{d['value']:{'+' if signed else ''}.4f} ± {d['se']:.4f}"
