"""Issue 13, families 1, 4 and 10 through the Python API: divergence, checkpoint validation, argument errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

import popgrad
from popgrad.train import CheckpointError, Trajectory


@pytest.fixture(scope="module")
def task():
    return popgrad.Task(popgrad.chain(4), popgrad.dirichlet_prior(2, 1.0, 2, seed=0, symmetrize=True))


def test_resume_is_bit_identical(task, tmp_path):
    ck = tmp_path / "c.npz"
    full = popgrad.train_two_stage(task, steps1=8, steps2=6, record_every=2)
    popgrad.train_two_stage(task, steps1=8, steps2=6, record_every=2, checkpoint_path=ck, checkpoint_every=5)
    resumed = popgrad.train_two_stage(task, steps1=8, steps2=6, record_every=2, checkpoint_path=ck, resume=True)
    assert np.array_equal(full.A2, resumed.A2) and np.array_equal(full.loss, resumed.loss)


@pytest.mark.parametrize("edit", [{"t": 10**6}, {"t": -1}, {"t": 2}, {"done": "yes"}, {"status": "weird"}])
def test_edited_metadata_is_refused(task, tmp_path, edit):
    ck = tmp_path / "c.npz"
    popgrad.train_two_stage(task, steps1=8, steps2=6, checkpoint_path=ck, checkpoint_every=5)
    with np.load(ck) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays["meta_json"]))
    meta.update(edit)
    arrays["meta_json"] = np.array(json.dumps(meta))
    with open(ck, "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.raises(CheckpointError, match="damaged or not a popgrad checkpoint"):
        popgrad.train_two_stage(task, steps1=8, steps2=6, checkpoint_path=ck, resume=True)


def test_checkpoint_path_arguments(task, tmp_path):
    with pytest.raises(TypeError, match="checkpoint_path"):
        popgrad.train_two_stage(task, steps1=2, steps2=0, checkpoint_path=3)
    with pytest.raises(ValueError, match="is a folder"):
        popgrad.train_two_stage(task, steps1=2, steps2=0, checkpoint_path=tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        popgrad.train_two_stage(task, steps1=2, steps2=0, checkpoint_path=tmp_path / "no" / "c.npz")


def test_trajectory_load_wrong_file(task, tmp_path):
    ck = tmp_path / "c.npz"
    popgrad.train_two_stage(task, steps1=2, steps2=0, checkpoint_path=ck)
    with pytest.raises(ValueError, match="not a popgrad trajectory file"):
        Trajectory.load(ck)
    (tmp_path / "t.npz").write_text("nope")
    with pytest.raises(ValueError, match="not a popgrad trajectory file"):
        Trajectory.load(tmp_path / "t.npz")


def test_divergence_keeps_records(task):
    traj = popgrad.train_two_stage(task, steps1=4, steps2=200, lr2=1e8, divergence_patience=20)
    assert traj.status == "diverged" and traj.step[-1] < 204 and np.all(np.isfinite(traj.A2))
