"""The optimizer base: parameter groups, the update loop, state (MegEngine's
``megengine.optimizer.Optimizer``)."""
import numpy as np

from mgtrace._core import Tensor
from mgtrace._core import tensor as _make_tensor
from mgtrace.autodiff import _tape, no_grad

__all__ = ["Optimizer"]


class Optimizer:
    """Updates parameters from their ``.grad``.

    Args:
        params: an iterable of Tensors, or of dicts each with ``"params"``
            (its tensors) and hyperparameters that override ``defaults``
            for that group.
        defaults: the hyperparameters (``lr``...) of a group that names none.

    Raises:
        TypeError: a parameter that is not a Tensor.
        ValueError: no parameters; a parameter that is not floating-point
            (its update would be truncated; GradManager.attach refuses it
            too); a parameter in two groups; a group without a required
            hyperparameter.
    """

    def __init__(self, params, defaults):
        self.param_groups = []
        self._state = {}          # id(param) -> {name: Tensor}
        if isinstance(params, Tensor):
            params = [params]
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__}: got no parameters to optimize")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        self._defaults = defaults
        for g in groups:
            self.add_param_group(g)

    def add_param_group(self, group):
        """Add a group: a dict with ``"params"`` and optional hyperparameters."""
        if not isinstance(group, dict) or "params" not in group:
            raise TypeError(f"{type(self).__name__}: a parameter group is a dict with 'params'")
        ps = group["params"]
        ps = [ps] if isinstance(ps, Tensor) else list(ps)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        for p in ps:
            if not isinstance(p, Tensor):
                raise TypeError(f"{type(self).__name__}: parameters are Tensors, not "
                                f"{type(p).__name__}")
            if not _tape.is_float(p):     # an update would be truncated to the integers
                raise ValueError(f"{type(self).__name__}: only floating-point tensors can be "
                                 f"optimized, got a {p.dtype} tensor of shape {p.shape}")
            if id(p) in seen:
                raise ValueError(f"{type(self).__name__}: a parameter (shape {p.shape}) appears in "
                                 "more than one group")
            seen.add(id(p))
        g = dict(self._defaults)
        g.update(group)
        g["params"] = ps
        for k, v in g.items():
            if v is _REQUIRED:
                raise ValueError(f"{type(self).__name__}: parameter group needs {k!r}")
        self._check_group(g)        # a group's own lr, momentum... as the constructor's
        self.param_groups.append(g)

    def _check_group(self, group):
        """Raise for a hyperparameter of ``group`` the update cannot take
        (each optimizer's own rules); the base class takes any."""

    def step(self):
        """One update of every parameter that has a gradient. Returns self."""
        with no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    st = self._state.setdefault(id(p), {})
                    self._update(p, p.grad, st, group)
        return self

    def _update(self, param, grad, state, group):
        raise NotImplementedError

    def clear_grad(self):
        """Set every parameter's ``.grad`` to None (MegEngine's name). Returns self."""
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None
        return self

    zero_grad = clear_grad

    def _params(self):
        return [p for g in self.param_groups for p in g["params"]]

    def state_dict(self):
        """``{"param_groups": [...], "state": {index: {name: ndarray}}}``: the
        hyperparameters (parameters by their index in group order) and each
        parameter's buffers as NumPy arrays."""
        index = {id(p): i for i, p in enumerate(self._params())}
        groups = []
        for g in self.param_groups:
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = [index[id(p)] for p in g["params"]]
            groups.append(d)
        state = {index[k]: {n: (v.numpy() if isinstance(v, Tensor) else v) for n, v in s.items()}
                 for k, s in self._state.items() if k in index}
        return {"param_groups": groups, "state": state}

    def load_state_dict(self, state):
        """Restore what :meth:`state_dict` returned (for the same parameters in
        the same order).

        Raises:
            ValueError: the groups or their sizes differ, or a buffer's shape
                differs from its parameter's.
        """
        groups = state["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(f"{type(self).__name__}.load_state_dict: {len(groups)} parameter "
                             f"groups saved, this optimizer has {len(self.param_groups)}")
        for saved, g in zip(groups, self.param_groups):
            if len(saved["params"]) != len(g["params"]):
                raise ValueError(f"{type(self).__name__}.load_state_dict: a group of "
                                 f"{len(saved['params'])} parameters saved, this one has "
                                 f"{len(g['params'])}")
        params = self._params()
        new_state = {}
        for i, s in state["state"].items():
            p = params[int(i)]
            buf = {}
            for n, v in s.items():
                if isinstance(v, (np.ndarray, Tensor)):
                    if tuple(v.shape) != tuple(p.shape):
                        raise ValueError(f"{type(self).__name__}.load_state_dict: buffer {n!r} "
                                         f"of parameter {i} has shape {tuple(v.shape)}, the "
                                         f"parameter {tuple(p.shape)}")
                    v = _make_tensor(np.asarray(v), p.dtype)
                buf[n] = v
            new_state[id(p)] = buf
        for saved, g in zip(groups, self.param_groups):
            g.update({k: v for k, v in saved.items() if k != "params"})
        self._state = new_state


class _Required:
    def __repr__(self):
        return "<required>"


_REQUIRED = _Required()


def write(param, value):
    """``param[...] = value``: the update in place, so modules keep their tensor."""
    param[...] = value
