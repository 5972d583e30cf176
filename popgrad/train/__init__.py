"""Step 4 of the data flow: deterministic gradient descent (DESIGN §8, §9).

* :mod:`.algorithm1` -- Algorithm 1 (``train_two_stage``), the one loop ``run_schedule`` every trainer
  shares, ``TrainConfig``, ``Trajectory``, checkpoints;
* :mod:`.multihead` -- the k-head schedule (``train_multi_head``) on the same loop.
"""
from .algorithm1 import MultiHeadTrainConfig, TrainConfig, Trajectory, run_schedule, train_two_stage
from .multihead import train_multi_head

__all__ = ["TrainConfig", "MultiHeadTrainConfig", "Trajectory", "train_two_stage", "train_multi_head", "run_schedule"]
