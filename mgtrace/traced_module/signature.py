"""How a module is called: the signature of its forward and the binding of
call arguments to it, shared by the tracer (recording a module call), the
edit recorder (checking a call inserted into a graph), and ``Expr``
(``set_args_kwargs`` on a module call).

A TracedModule answers with the forward it was traced from
(``_signature``, ``_orig_name``), so a re-traced or loaded module binds and
names its arguments as the original did.
"""
import collections
import inspect

from mgtrace.traced_module.pytree import LeafDef

__all__ = ["type_name", "signature_of", "bind_arguments", "input_names"]


def type_name(module):
    """The class name of ``module``; for a TracedModule, that of the module
    it was traced from (so re-tracing keeps the names)."""
    return module.__dict__.get("_orig_name") or type(module).__name__


_SIGNATURES = {}     # forward function of a class -> signature of the bound method


def signature_of(module):
    """The signature of ``module.forward`` (bound: no ``self``); for a
    TracedModule, that of the forward it was traced from. Cached per class,
    as the tracer asks for it on every module call."""
    sig = module.__dict__.get("_signature")
    if sig is not None:
        return sig
    if "forward" in module.__dict__:            # forward replaced on the instance
        return inspect.signature(module.forward)
    fn = type(module).forward
    sig = _SIGNATURES.get(fn)
    if sig is None:
        sig = _SIGNATURES[fn] = inspect.signature(module.forward)
    return sig


def bind_arguments(sig, args, kwargs, owner):
    """forward's arguments in parameter order, defaults filled in: a tuple
    (``*args`` as a tuple, ``**kwargs`` as a dict).

    Raises:
        TypeError: the arguments do not bind; a keyword that names no
            parameter is named first (``tm(y=x)`` for ``forward(x)`` says
            ``y``, not only that ``x`` is missing)."""
    unknown = _unknown_keywords(sig, kwargs)
    if unknown:
        raise TypeError(f"{owner}.forward{sig}: unexpected keyword argument"
                        f"{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                        f"forward's parameters are {', '.join(sig.parameters) or 'none'}")
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"{owner}.forward{sig}: {e}") from None
    bound.apply_defaults()
    return tuple(bound.arguments.values())


def _unknown_keywords(sig, kwargs):
    """Keywords of ``kwargs`` that no parameter of ``sig`` takes."""
    params = sig.parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return []
    return [k for k in kwargs if k not in sig.parameters]


def input_names(sig, arg_def):
    """A name per input slot of ``arg_def``: the parameter's name, joined
    with the path to the leaf for a container argument (``batch_img`` for
    ``batch["img"]``, ``pair_0`` for ``pair[0]``)."""
    names = []
    for p, c in zip(sig.parameters, arg_def.children):
        names += _leaf_names(p, c)
    return names


def _leaf_names(prefix, tdef):
    if isinstance(tdef, LeafDef):
        return [prefix] if tdef.is_slot else []
    keys = tdef.aux if tdef.type in (dict, collections.OrderedDict) else range(len(tdef.children))
    names = []
    for k, c in zip(keys, tdef.children):
        names += _leaf_names(f"{prefix}_{k}", c)
    return names
