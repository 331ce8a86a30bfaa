"""Learning-rate schedules: call ``step()`` once per epoch (MegEngine's
``LRScheduler``)."""
import bisect
import math

__all__ = ["LRScheduler", "MultiStepLR", "CosineAnnealingLR"]


class LRScheduler:
    """Sets each group's ``lr`` from its initial value and the epoch count.

    Raises:
        TypeError: ``optimizer`` is no Optimizer.
    """

    def __init__(self, optimizer, current_epoch=-1):
        from mgtrace.optimizer.optimizer import Optimizer
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(self).__name__} takes an Optimizer, not "
                            f"{type(optimizer).__name__}")
        self.optimizer = optimizer
        for g in optimizer.param_groups:
            g.setdefault("initial_lr", g["lr"])
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self.current_epoch = current_epoch
        self.step()

    def get_lr(self):
        raise NotImplementedError

    def step(self):
        """Advance one epoch and set the groups' learning rates."""
        self.current_epoch += 1
        for g, lr in zip(self.optimizer.param_groups, self.get_lr()):
            g["lr"] = lr

    def state_dict(self):
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state):
        self.__dict__.update(state)


class MultiStepLR(LRScheduler):
    """``lr = initial_lr * gamma ** (milestones passed)`` (MegEngine's).

    Raises:
        ValueError: milestones not increasing.
    """

    def __init__(self, optimizer, milestones, gamma=0.1, current_epoch=-1):
        milestones = list(milestones)
        if milestones != sorted(milestones):
            raise ValueError(f"MultiStepLR: milestones must increase, got {milestones}")
        self.milestones = milestones
        self.gamma = gamma
        super().__init__(optimizer, current_epoch)

    def get_lr(self):
        k = bisect.bisect_right(self.milestones, self.current_epoch)
        return [lr * self.gamma ** k for lr in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """``lr = eta_min + (initial_lr - eta_min) (1 + cos(pi t / T_max)) / 2``
    for epoch t (Loshchilov and Hutter 2017, without restarts; PyTorch's
    closed form); stays at eta_min after T_max.

    Raises:
        ValueError: T_max < 1.
    """

    def __init__(self, optimizer, T_max, eta_min=0.0, current_epoch=-1):
        if T_max < 1:
            raise ValueError(f"CosineAnnealingLR: T_max must be >= 1, got {T_max}")
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer, current_epoch)

    def get_lr(self):
        t = min(self.current_epoch, self.T_max)
        c = (1 + math.cos(math.pi * t / self.T_max)) / 2
        return [self.eta_min + (lr - self.eta_min) * c for lr in self.base_lrs]
