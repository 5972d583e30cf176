"""Step 4 of the data flow: deterministic gradient descent (DESIGN §8, §9).

* :mod:`.config` -- ``TrainConfig``, ``MultiHeadTrainConfig`` (natural-unit learning rates);
* :mod:`.loop` -- the one loop ``run_schedule`` every trainer shares (it knows no model: a ``Scheme``
  protocol), divergence, its state, checkpoints;
* :mod:`.reduced` -- the reduced model's scheme (``ReducedScheme``);
* :mod:`.trajectory` -- ``Trajectory``, the record of a run;
* :mod:`.algorithm1` -- Algorithm 1 (``train_two_stage``: exact / field / idealized Stage 1, exact /
  sampled Stage 2);
* :mod:`.multihead` -- the k-head schedule (``train_multi_head``) on the same loop;
* :mod:`.optim` -- optimizers as optax-style transformations (``sgd``, ``adam``, ``adamw``, ``chain``, ...;
  schedules as functions of the step) and the official ones by name (``Optimizer``);
* :mod:`.catformer` -- the full model with those optimizers (``train_catformer``) on the same loop.
"""
from .algorithm1 import train_two_stage
from .config import MultiHeadTrainConfig, TrainConfig
from .loop import CheckpointError, Scheme, load_checkpoint, run_schedule
from .trajectory import Monotonicity, Trajectory, attention_to_parent
from .optim import Optimizer
from .multihead import train_multi_head
from .catformer import CatFormerTrajectory, train_catformer

__all__ = ["TrainConfig", "MultiHeadTrainConfig", "Trajectory", "train_two_stage", "train_multi_head", "run_schedule",
           "load_checkpoint", "CheckpointError", "attention_to_parent", "train_catformer", "CatFormerTrajectory",
           "Optimizer", "Monotonicity", "Scheme"]
