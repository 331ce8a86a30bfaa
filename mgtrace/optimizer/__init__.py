"""mgtrace.optimizer: parameter updates from ``.grad`` (MegEngine's
``megengine.optimizer``): SGD, Adam, AdamW, gradient clipping and
learning-rate schedules.

    opt = mgtrace.optimizer.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with gm:
        gm.backward(loss_fn(model(x), y))
    opt.step().clear_grad()
"""
from mgtrace.optimizer.clip_grad import clip_grad_norm, clip_grad_value
from mgtrace.optimizer.lr_scheduler import CosineAnnealingLR, LRScheduler, MultiStepLR
from mgtrace.optimizer.optimizer import Optimizer
from mgtrace.optimizer.sgd import SGD, Adam, AdamW

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "clip_grad_norm", "clip_grad_value",
           "LRScheduler", "MultiStepLR", "CosineAnnealingLR"]
