"""Function: an operation with a gradient written by hand (MegEngine's
``megengine.autodiff.Function``), e.g. fake quantization's straight-through
estimator."""
from mgtrace._core import Tensor
from mgtrace.autodiff import _tape

__all__ = ["Function"]


class Function:
    """Subclass it with ``forward(self, *inputs)`` and ``backward(self,
    *output_grads)``; call an instance on tensors.

    ``forward`` runs unrecorded and returns a Tensor or a tuple of them;
    it may keep on ``self`` what ``backward`` needs. ``backward`` gets one
    gradient per output (None for an output no gradient reached) and
    returns one per input (a Tensor, or None for no gradient), a single
    value when there is one input. An instance is used for one call.

    >>> import mgtrace as mt
    >>> from mgtrace.autodiff import Function, GradManager
    >>> class RoundSTE(Function):            # round, gradient passed straight through
    ...     def forward(self, x):
    ...         return mt.functional.round(x)
    ...     def backward(self, dy):
    ...         return dy
    >>> w = mt.tensor([0.4, 1.6])
    >>> gm = GradManager().attach(w)
    >>> with gm:
    ...     gm.backward((RoundSTE()(w) * 3.0).sum())
    >>> w.grad.tolist()
    [3.0, 3.0]
    """

    def forward(self, *inputs):
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def backward(self, *output_grads):
        raise NotImplementedError(f"{type(self).__name__} must define backward()")

    def __call__(self, *inputs):
        edges = [_tape.edge_of(x) for x in inputs]
        with _tape.no_grad():
            res = self.forward(*inputs)
        if _tape._no_grad.depth or not any(edges):
            return res
        outs = tuple(res) if isinstance(res, (tuple, list)) else (res,)
        node = _tape.Node()
        node.name = type(self).__name__
        node.rule = _tape_rule(self, len(inputs))
        node.params = {}
        node.edges = tuple(edges)
        node.in_meta = tuple((x.shape, x.dtype) if isinstance(x, Tensor) else None for x in inputs)
        node.out_meta = tuple((o.shape, o.dtype) if isinstance(o, Tensor) else None for o in outs)
        node.inputs = node.outputs = None
        node.versions = ()
        node.owners = frozenset().union(*[_tape.owners_of(e) for e in edges if e is not None])
        node.pending = set(node.owners)
        # a fresh alias per output: forward may have returned an input itself
        fresh = tuple(o.detach() if isinstance(o, Tensor) else o for o in outs)
        for i, o in enumerate(fresh):
            if isinstance(o, Tensor) and _tape.is_float(o):
                o.__dict__["_ad"] = (node, i)
        return fresh if isinstance(res, (tuple, list)) else fresh[0]


def _tape_rule(fn, n_inputs):
    from mgtrace.autodiff.rules import Rule

    def rule(ctx, gouts):
        gins = fn.backward(*(gouts if isinstance(gouts, list) else [gouts]))
        if not isinstance(gins, (tuple, list)):
            gins = (gins,)
        if len(gins) != n_inputs:
            raise ValueError(f"{type(fn).__name__}.backward returned {len(gins)} gradients for "
                             f"{n_inputs} inputs")
        return tuple(gins)
    return Rule(rule)
