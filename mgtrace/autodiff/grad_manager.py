"""GradManager: MegEngine's way to ask for gradients.

    gm = GradManager().attach(model.parameters())
    with gm:                      # record()
        loss = loss_fn(model(x), label)
        gm.backward(loss)         # param.grad += d loss / d param; release()
    opt.step().clear_grad()
"""
from mgtrace._core import Tensor
from mgtrace._core import tensor as _make_tensor
from mgtrace.autodiff import _tape

__all__ = ["GradManager"]


class GradManager:
    """Records the ops that use its attached tensors between :meth:`record`
    and :meth:`release` (``with gm:``), and computes their gradients with
    :meth:`backward` (MegEngine's ``megengine.autodiff.GradManager``).

    Several managers may record at once; each sees the ops of its own
    attached tensors and accumulates only into them.
    """

    def __init__(self):
        self._attached = {}       # id(tensor) -> (tensor, [callbacks])
        self._session = None

    def attach(self, params, callbacks=None):
        """Attach ``params`` (a Tensor or an iterable of them: the float
        tensors whose gradients :meth:`backward` computes). ``callbacks``
        (a callable or a list of them) run as ``cb(param, grad) -> grad``
        on each gradient before it is added to ``param.grad``. Attaching a
        tensor again adds its callbacks. Returns self.

        Raises:
            TypeError: a param that is not a Tensor, or a callback that is
                not callable.
            ValueError: a param that is not floating point.
        """
        if isinstance(params, Tensor):
            params = [params]
        if callbacks is None:
            callbacks = []
        elif callable(callbacks):
            callbacks = [callbacks]
        else:
            callbacks = list(callbacks)
        for cb in callbacks:
            if not callable(cb):
                raise TypeError(f"GradManager.attach: a callback must be callable, not "
                                f"{type(cb).__name__}")
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"GradManager.attach takes Tensors, not {type(p).__name__}")
            if not _tape.is_float(p):
                raise ValueError(f"GradManager.attach: only floating-point tensors have "
                                 f"gradients, got a {p.dtype} tensor of shape {p.shape}")
            entry = self._attached.get(id(p))
            if entry is None:
                self._attached[id(p)] = (p, list(callbacks))
                p.__dict__.setdefault("_ad_managers", []).append(self)
            else:
                entry[1].extend(callbacks)
        return self

    def attached_tensors(self):
        """The attached tensors, in attach order."""
        return [p for p, _ in self._attached.values()]

    def detach(self, params=None):
        """Stop computing gradients for ``params`` (all attached ones if None)."""
        if params is None:
            params = self.attached_tensors()
        elif isinstance(params, Tensor):
            params = [params]
        for p in params:
            if self._attached.pop(id(p), None) is not None:
                p.__dict__["_ad_managers"].remove(self)

    @property
    def is_recording(self):
        return self._session is not None

    def record(self):
        """Start recording the calling thread's ops. Recordings and traces
        take turns across threads: while another thread records or traces,
        this waits for it to end (their ops would not be this thread's).

        Raises:
            RuntimeError: already recording.
        """
        if self._session is not None:
            raise RuntimeError("GradManager.record: already recording")
        session = _tape.Session(self)
        _tape.start(session)
        self._session = session

    def release(self):
        """Stop recording and forget what was recorded (a no-op when not
        recording), in the thread that called :meth:`record`.

        Raises:
            RuntimeError: called from another thread.
        """
        if self._session is not None:
            _tape.stop(self._session)       # (raises, still recording, from another thread)
            self._session = None

    def __enter__(self):
        self.record()
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def backward(self, y=None, dy=None):
        """Add the gradients of ``y`` with respect to the attached tensors
        into their ``.grad`` (``grad = dy`` times the Jacobian, summed over
        several ``y``), then :meth:`release`.

        Args:
            y: a Tensor or a list of them, computed while recording (None:
                just release).
            dy: the gradient of each y (default: ones of y's shape, so a
                scalar loss gives its plain gradient); same structure as y.
                An integer or bool dy (array or Tensor) is taken in y's dtype.

        Raises:
            RuntimeError: not recording, or called from another thread than
                :meth:`record` (nothing is computed; still recording).
            ValueError: dy's shape differs from y's.
            AutodiffError: an op on the way has no gradient rule, or a tensor
                saved for backward was written in place since.
        """
        if self._session is None:
            raise RuntimeError("GradManager.backward: no recording in progress "
                               "(call it inside 'with gm:' or after gm.record())")
        _tape.check_thread(self._session, "backward")
        try:
            if y is None:
                return
            ys = list(y) if isinstance(y, (list, tuple)) else [y]
            if dy is None:
                dys = [None] * len(ys)
            else:
                dys = list(dy) if isinstance(dy, (list, tuple)) else [dy]
            if len(dys) != len(ys):
                raise ValueError(f"GradManager.backward: {len(ys)} y but {len(dys)} dy")
            roots = []
            for t, d in zip(ys, dys):
                if not isinstance(t, Tensor):
                    raise TypeError(f"GradManager.backward: y must be Tensors, not "
                                    f"{type(t).__name__}")
                if d is None:
                    d = _ones_like(t)
                else:
                    d = d if isinstance(d, Tensor) else _make_tensor(d, t.dtype)
                    if d.dtype.kind in "biu" and _tape.is_float(t):
                        d = d.astype(t.dtype)     # as a list or array dy is taken: every
                        #                           gradient rule then sees y's dtype
                    if tuple(d.shape) != tuple(t.shape):
                        raise ValueError(f"GradManager.backward: dy has shape {tuple(d.shape)}, "
                                         f"y has {tuple(t.shape)}")
                roots.append((t, d))
            leaves = _tape.backward(self._session, roots)
            with _tape.no_grad():
                for p, g in leaves.values():
                    entry = self._attached.get(id(p))
                    if entry is None:
                        continue
                    for cb in entry[1]:
                        g = cb(p, g)
                    p.grad = g if p.grad is None else p.grad + g
        finally:
            self.release()

    def __repr__(self):
        state = "recording" if self._session is not None else "idle"
        return f"GradManager({len(self._attached)} attached, {state})"


def _ones_like(t):
    from mgtrace import functional as F
    return F.ones_like(t)
