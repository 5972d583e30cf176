"""Step 4 of the data flow: deterministic gradient descent (DESIGN §8, §9).

* :mod:`.config` -- ``TrainConfig``, ``MultiHeadTrainConfig`` (natural-unit learning rates);
* :mod:`.loop` -- the one loop ``run_schedule`` every trainer shares, its state, checkpoints;
* :mod:`.trajectory` -- ``Trajectory``, the record of a run;
* :mod:`.algorithm1` -- Algorithm 1 (``train_two_stage``: exact / field / idealized Stage 1, exact /
  sampled Stage 2);
* :mod:`.multihead` -- the k-head schedule (``train_multi_head``) on the same loop;
* :mod:`.optim` -- the official optimizers (SGD with coupled decay, Adam, AdamW; constant/cosine schedule);
* :mod:`.catformer` -- the full model with those optimizers (``train_catformer``) on the same loop.
"""
from .algorithm1 import train_two_stage
from .config import MultiHeadTrainConfig, TrainConfig
from .loop import CheckpointError, load_checkpoint, run_schedule
from .trajectory import Trajectory, attention_to_parent
from .multihead import train_multi_head
from .catformer import CatFormerTrajectory, train_catformer

__all__ = ["TrainConfig", "MultiHeadTrainConfig", "Trajectory", "train_two_stage", "train_multi_head", "run_schedule",
           "load_checkpoint", "CheckpointError", "attention_to_parent", "train_catformer", "CatFormerTrajectory"]
