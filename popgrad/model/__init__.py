"""Step 2 of the data flow: the models' forward passes in NumPy (the references of the engines).

* :mod:`.reduced` -- the reduced two-layer model of the paper (DESIGN §3): ``predict``;
* :mod:`.multihead` -- the k-head model of multi-parent graphs (DESIGN §9): ``predict_multi``.
"""
from .multihead import head_attention, predict_multi
from .reduced import first_layer_attention, layer1_output, predict, second_layer_scores, softmax

__all__ = ["predict", "predict_multi", "first_layer_attention", "head_attention", "layer1_output",
           "second_layer_scores", "softmax"]
