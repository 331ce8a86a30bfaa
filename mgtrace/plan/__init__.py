"""Inference plans: a module compiled, at fixed input shapes, dtypes and
device, into the sequence of kernel calls one forward makes, replayed from
C with the GIL released (MegEngine users know the idea as
``jit.trace(symbolic=True)``).

>>> import mgtrace as mt, mgtrace.module as M
>>> net = M.Sequential(M.Linear(4, 3), M.ReLU()).eval()
>>> x = mt.tensor([[1.0, -2.0, 3.0, 0.5]])
>>> plan = mt.compile(mt.trace_module(net, x), x)
>>> bool((plan(x).numpy() == net(x).numpy()).all())
True

How a plan is made (``mgtrace.compile``): the module runs once on the
example inputs while every core op, functional call and module call is
recorded with the kernel calls the backend received for it
(:mod:`._record`). Lowering (:mod:`._lower`) turns each recorded core op
whose kernel calls it can account for (elementwise, GEMM, reductions and
the nn members the recorder wraps: NCHW and NCHW16c convolutions and fused
blocks, conv_transpose2d, conv3d, recurrent cells, pooling, resize, layer
norm, local response norm, attention) into kernel steps that C replays with
no Python in between; an embedding lookup (getitem by offsets computed from
the indices' values, which no recorded call can replay) becomes a gather
step that reads the indices on each call; views cost nothing; everything else runs as a Python
step that calls the same function on views of the plan's memory, so
outputs are bitwise the graph's. Intermediates written by kernel steps share one arena placed
by a liveness-based memory plan; each output the forward computes is a new
tensor on every call (an input or module tensor returned as an output is a
view of its memory, where the module returns the tensor itself).

On each call a guard compares every input's dtype, device, shape and
strides with the plan's; a call that differs gets its own plan (up to
``cache_size`` signatures, made on first use) or, once the cache is full,
runs the module itself.

Threads: a program is recorded at one thread count, the count the module's
kernels would use at that moment (:func:`mgtrace.set_num_threads`, fewer
under load with :func:`mgtrace.set_adaptive_threads`), and its kernel steps
are replayed with that count only: a call at another count runs a program
recorded at the new count (made on first use, from the same cache), so a
plan follows the current setting as the module does, and its outputs stay
the module's bitwise at the same count. Several kernels size their
workspace and split their work by the count they are given, so a program is
never run at a count it was not recorded at.

Adaptive threads (:func:`mgtrace.set_adaptive_threads`) lower the count
with the load, call by call: a plan keeps, per signature, the program at
the configured count (:func:`mgtrace.get_num_threads`) and at most one
program at a lowered count. A call at a lowered count ``c`` runs that one
if it was recorded at ``c`` or fewer threads (fewer threads than the load
allows never wait for a descheduled one), else records one at ``c`` in its
place. So a load that moves between counts records at most a few programs
(each lower than the last) and never fills the cache, where every count
having its own program filled it in a few calls and then ran the module,
eagerly, on every call at a count without one. Outputs under adaptive
threads are the module's at the count of the program that ran
(:meth:`Plan.step_threads`).

Weights: the plan watches the storage versions of the module's parameters
and buffers (:class:`mgtrace._core.plan.VersionWatch`); an in-place write
(``load_state_dict``, an optimizer step) drops every program, and the next
call records afresh, so packed copies and live reads never mix old and new
values. It holds the tensors it recorded: rebind them (new tensors), edit
the graph, or load the module again, and compile it again.

A call made while a hook is installed in its thread (a GradManager
recording, a tracer) runs the module, so the hook sees its ops.
"""
import gc
import threading
import warnings

import numpy as np

from mgtrace._core import plan as _cplan
from mgtrace._core.dispatch import _pin_run_threads, get_num_threads as _num_threads, \
    run_threads as _run_threads
from mgtrace._core import trace_hooks as _hooks
from mgtrace._core.tensor import Tensor, empty_host_cache
from mgtrace.errors import NoKernelError
from mgtrace.module.snapshot import ModuleSnapshot
from mgtrace.plan._lower import (ARENA, CONST, DYNAMIC, INPUT, OUTPUT, Lowering, PyStep, _Unknown,
                                 place, step_buffers)
from mgtrace.plan._qact import fold_float_relu6
from mgtrace.plan._qblock import fuse_int8_blocks
from mgtrace.plan._record import PlanError, SharedMemoryError, quant_tag, record, retag
from mgtrace.traced_module.pytree import tree_flatten

__all__ = ["Plan", "PlanError", "compile"]


def _quant_key(t):
    """A quantized input's quantized dtype, scale, zero point and axis (the
    int8 steps' multipliers and the byte flip were made for them), None for
    any other tensor."""
    if quant_tag(t) is None:
        return None
    from mgtrace.quantization.qtensor import qparams_of
    q = qparams_of(t)
    zp = None if q.zero_point is None else np.asarray(q.zero_point.numpy(), np.float64).tobytes()
    return (q.dtype_meta.name, np.asarray(q.scale.numpy(), np.float64).tobytes(), zp, q.axis)


def _signature(inputs):
    sig = []
    for t in inputs:
        if not isinstance(t, Tensor):
            return None
        _, _, _, _, _, dtype, dev, strides = _cplan.tensor_info(t)
        qkey = _quant_key(t)
        sig.append((dtype if qkey is None else (dtype, qkey), dev, tuple(t.shape), strides))
    return tuple(sig)


class _Program:
    """One plan at one input signature and thread count: the executor and
    the Python steps."""

    def __init__(self, module, inputs, threads):
        self.threads = threads
        start = _cplan.next_uid()
        pinned = _pin_run_threads(threads)      # every kernel recorded at this count
        try:
            top, out, packed = record(module, inputs, start)
        finally:
            _pin_run_threads(pinned)
        low = Lowering(inputs, start, packed)
        try:
            low.lower(top)
        except _Unknown as e:
            rec = e.args[0]
            raise PlanError(f"{rec.where}: uses memory made outside mgtrace's core ops, which a "
                            "plan cannot follow") from None
        leaves, self.out_def = tree_flatten(out, lambda v: isinstance(v, Tensor))
        self.out_slots = []
        for v in leaves:
            if isinstance(v, Tensor):
                s = low.slot(v)
                if low.buffers[s.buf].kind == ARENA:
                    low.buffers[s.buf].kind = OUTPUT
                self.out_slots.append(((s.buf, s.off, s.dtype, s.shape, s.strides), s.quant))
            else:
                self.out_slots.append(v)
        self.example_out = out
        kept = {s[0][0] for s in self.out_slots if isinstance(s, tuple)}
        low.steps = fold_float_relu6(fuse_int8_blocks(low.steps, kept), low.buffers, kept)
        self.pysteps = []
        for pos, step in enumerate(low.steps):
            for b in step_buffers(step):
                low._use(b, pos)
        self.arena_bytes = place(low.buffers)
        ex = _cplan.Executor(len(low.buffers), low.device if low.device is not None else 0)
        for i, b in enumerate(low.buffers):
            ex.set_buffer(i, b.kind, b.where, b.nbytes, b.const)
        ex.set_arena(self.arena_bytes)
        self.step_names = []
        for step in low.steps:
            if step[0] == "kernel":
                ex.add_captured(step[1], step[2])
                self.step_names.append(("kernel", f"{step[3]}: {step[1].describe()}"))
            elif step[0] == "quant":
                call, nt, ints, floats = step[1]
                ex.add_quant(_cplan.Q_CALLS[call], nt, step[2], ints, floats)
                self.step_names.append(("kernel", f"{step[3]}: int8 {call}"))
            elif step[0] == "gather":
                isz, signed, n, rows, row_bytes, src_stride = step[1]
                ex.add_gather(*step[2], isz, signed, n, rows, row_bytes, src_stride)
                self.step_names.append(("kernel", f"{step[3]}: gather n={n} rows={rows} "
                                                  f"row_bytes={row_bytes}"))
            else:
                ex.add_callback(len(self.pysteps))
                self.pysteps.append(step[1])
                self.step_names.append(("python", step[1].what))
        self.executor = ex
        self.kernel_steps, self.python_steps = ex.counts()
        self.buffers = low.buffers

    def _step(self, run, index):
        ps = self.pysteps[index]
        args = [retag(run.view(s.buf, s.off, s.dtype, s.shape, s.strides), s.quant)
                if hasattr(s, "buf") else s for s in ps.leaves]
        a, k = ps.treedef.unflatten(args)
        out = ps.call(*a, **k)
        if ps.out_bind:
            leaves = [t for t in tree_flatten(out, lambda v: isinstance(v, Tensor))[0]
                      if isinstance(t, Tensor)]
            for i, buf, off, dtype, shape in ps.out_bind:
                t = leaves[i] if i < len(leaves) else None
                info = _cplan.tensor_info(t) if t is not None else None
                if info is None or info[0] - info[2] != off or info[5] != dtype or tuple(t.shape) != shape:
                    raise PlanError(f"{ps.what} returned another layout than when the plan was "
                                    "made; compile the module again")
                run.bind(buf, t)

    def profile(self, inputs):
        run = self.executor.run(inputs, self._step, True)
        if run is None:
            return None
        return [(kind, what, ns * 1e-9) for (kind, what), ns in zip(self.step_names, run.step_ns)]

    def __call__(self, inputs):
        run = self.executor.run(inputs, self._step)
        if run is None:
            return _RERUN
        leaves = [retag(run.view(*s[0]), s[1]) if isinstance(s, tuple) else s
                  for s in self.out_slots]
        return self.out_def.unflatten(leaves)


class Plan:
    """A compiled module (see :mod:`mgtrace.plan`); call it as the module.

    Attributes:
        module: the module it runs.
        cache_size: how many input signatures get a plan of their own.
    """

    def __init__(self, module, example_inputs, cache_size=4):
        self.module = module
        self.cache_size = int(cache_size)
        if self.cache_size < 1:
            raise ValueError(f"compile: cache_size must be at least 1, got {cache_size}")
        self._programs = {}
        self._refused = {}       # signature -> why it cannot be planned (later calls run the module)
        self._lock = threading.Lock()
        self.misses = 0          # calls run by the module itself (cache full, or not tensors)
        _check_module(module)
        self._make(tuple(example_inputs), _run_threads())
        self._watch = _watch(module)

    def _make(self, inputs, threads, replaces=None):
        """Record the program for ``inputs`` at ``threads`` and keep it if
        the cache has room; ``replaces``: the key of a program it takes the
        place of (the signature's lowered-count one)."""
        sig = _signature(inputs)
        if sig is None:
            raise TypeError("compile: example inputs must be Tensors, got "
                            + ", ".join(type(t).__name__ for t in inputs))
        for dtype, dev, shape, strides in sig:
            if dev != 0 and not _on_cpu(inputs):
                raise NoKernelError(f"compile: plans run on the CPU only so far (inputs on "
                                    f"{[str(t.device) for t in inputs]}); run the module itself "
                                    "on that device")
        _check_aliasing(_module_tensors(self.module), inputs)
        snapshot = ModuleSnapshot(self.module)
        try:
            prog = _Program(self.module, inputs, threads)
        finally:
            rebound, other = snapshot.restore()
        if rebound:
            raise PlanError(f"compile: the forward changes {', '.join(rebound)} (state kept "
                            "from call to call, as `self.n = self.n + 1` or "
                            "`self.hist.append(x)` do): a plan replays a computation without "
                            "state; run the module itself (a module that only sets it up on its "
                            "first call: call the module once first)")
        if other:
            warnings.warn(f"compile: the forward changes {', '.join(other)} on every call; a plan "
                          "replays its kernels and does not (the module was put back as it was "
                          "before compiling)", RuntimeWarning, stacklevel=3)
        # the recording freed the forward's intermediates as it went (its
        # records hold TensorMeta); give the blocks the host allocator kept
        # for reuse back to the OS (the plan's intermediates live in its one
        # arena)
        gc.collect()
        empty_host_cache()
        with self._lock:
            # two threads with new signatures can both pass __call__'s
            # cache check: the cache still holds at most cache_size plans
            # (a plan made past it serves its one call)
            have = self._programs.get((sig, threads))
            if have is not None:
                return have
            if replaces is not None:
                self._programs.pop(replaces, None)
            stale = self._stale_key(threads)
            if len(self._programs) >= self.cache_size and stale is not None:
                del self._programs[stale]
            if len(self._programs) < self.cache_size:
                self._programs[sig, threads] = prog
        return prog

    def _stale_key(self, threads):
        """The key of a program recorded at a thread count that is neither
        ``threads`` nor the configured one (the count changed since): the
        one a full cache gives up first, else None."""
        top = _num_threads()
        return next((k for k in self._programs if k[1] != threads and k[1] != top), None)

    def _try_make(self, inputs, sig, threads, replaces):
        """_make, or None where these inputs cannot be planned: that call
        and, when the refusal is the signature's, later calls with the same
        signature run the module (warned once)."""
        try:
            return self._make(inputs, threads, replaces)
        except SharedMemoryError:
            return None
        except PlanError as e:
            with self._lock:
                if len(self._refused) >= 64:
                    self._refused.clear()
                self._refused[sig] = str(e)
                # (a refused write was undone by writing the old values back,
                # which counts as a write: the programs stay valid)
                self._watch = _watch(self.module)
            warnings.warn(f"Plan: inputs of shapes {[tuple(t.shape) for t in inputs]} cannot "
                          f"be planned, so calls with them run the module: {e}", RuntimeWarning,
                          stacklevel=3)
            return None

    def _check_weights(self):
        """Drops every program when a parameter or buffer of the module was
        written in place since they were recorded (load_state_dict, an
        optimizer step): packed weights and folded constants are copies, so
        a program would mix old and new values."""
        if self._watch.changed():
            with self._lock:
                self._programs.clear()      # (refusals stay: they are the forward's, not the values')
                self._watch = _watch(self.module)

    @property
    def signatures(self):
        """The input signatures that have a plan: per input (dtype code,
        device id, shape, strides); a quantized input's dtype code is paired
        with its qparams (dtype name, scale, zero point, axis), so an input
        quantized with other qparams gets a plan of its own. (A signature
        with programs at several thread counts is listed once.)"""
        return list(dict.fromkeys(sig for sig, _ in self._programs))

    def _program(self, inputs):
        """The program a call with ``inputs`` would run now, else None."""
        sig, threads = _signature(inputs), _run_threads()
        prog = self._programs.get((sig, threads))
        if prog is None and threads < _num_threads():
            prog = self._lowered(sig, threads)[0]
        return prog

    def _lowered(self, sig, threads):
        """(program, key) of ``sig``'s program at a count below the
        configured one, the program None unless it runs at ``threads`` or
        fewer; (None, None) when the signature has none."""
        top = _num_threads()
        for key, prog in list(self._programs.items()):
            if key[0] == sig and key[1] < top:
                return (prog if key[1] <= threads else None), key
        return None, None

    def stats(self, *inputs):
        """{"kernel_steps", "python_steps", "arena_bytes"} of the plan for
        ``inputs`` at the current thread count (default: the first one made).

        Raises:
            KeyError: no program for these inputs at this thread count
                (call the plan with them once first).
        """
        prog = self._program(inputs) if inputs else next(iter(self._programs.values()))
        if prog is None:
            raise KeyError("stats: the plan has no program for these inputs at "
                           f"{_run_threads()} thread(s); call the plan with them once first")
        return {"kernel_steps": prog.kernel_steps, "python_steps": prog.python_steps,
                "arena_bytes": prog.arena_bytes}

    def step_threads(self, *inputs):
        """The thread count each step of the program for ``inputs`` at the
        current count (:func:`mgtrace._core.dispatch.run_threads`) calls its
        kernel with, read from the executor; None for a step whose kernel
        picks its count when it runs (elementwise, gather, Python steps).

        Raises:
            KeyError: no program for these inputs at this thread count
                (call the plan with them once first).
        """
        prog = self._program(inputs)
        if prog is None:
            raise KeyError("step_threads: the plan has no program for these inputs at "
                           f"{_run_threads()} thread(s); call the plan with them once first")
        return prog.executor.step_threads()

    def profile(self, *inputs, repeats=1):
        """Per step of the plan for ``inputs`` (which must have a plan: the
        example inputs' signature or one made since), in order: (kind,
        what, seconds), kind "kernel" or "python", what the module path
        and call it came from and the kernel, seconds the step's best wall
        time over ``repeats`` runs (each a full call of the plan; the
        outputs are dropped).

        Raises:
            KeyError: no plan for these inputs' signature (call the plan
                with them once first).
            ValueError: repeats below 1.
        """
        if repeats < 1:
            raise ValueError(f"profile: repeats must be at least 1, got {repeats}")
        prog = self._program(inputs)
        if prog is None:
            raise KeyError("profile: the plan has no program for these inputs' dtypes, devices, "
                           "shapes and strides at this thread count; call the plan with them "
                           "once first")
        best = None
        for _ in range(repeats):
            steps = prog.profile(inputs)
            if steps is None:        # a kernel asked for the graph's way (non-finite input)
                continue
            best = steps if best is None else [(k, w, min(t, b[2])) for (k, w, t), b in
                                                zip(steps, best)]
        return best or []

    def __call__(self, *inputs):
        if _hooks.active is not None and _hooks.owner == _hooks.get_ident():
            # a GradManager recording (or a tracer): the module's own ops
            # are what it must see (a plan's kernels would leave no gradient)
            self.misses += 1
            return self.module(*inputs)
        self._check_weights()
        sig = _signature(inputs)
        threads = _run_threads()         # what the module's kernels would get now
        prog = self._programs.get((sig, threads))
        if prog is None and sig is not None and sig not in self._refused and _on_cpu(inputs):
            replaces = None
            if threads < _num_threads():     # adaptive threads lowered it: one such program
                prog, replaces = self._lowered(sig, threads)
            if prog is None and (replaces is not None or len(self._programs) < self.cache_size
                                 or self._stale_key(threads) is not None):
                prog = self._try_make(inputs, sig, threads, replaces)
        if prog is not None:
            out = prog(inputs)
            if out is not _RERUN:        # (else a kernel asked for the graph's own way)
                return out
        self.misses += 1
        return self.module(*inputs)

    def __reduce__(self):
        # (its programs hold C steps and addresses: pickling or deep-copying
        # one reached a Tensor's or a Cython object's own refusal)
        raise TypeError("a Plan does not pickle or copy: save its module (mgtrace.save), copy "
                        "the module, and compile the copy")

    def __deepcopy__(self, memo):
        self.__reduce__()

    def __repr__(self):
        return (f"Plan({type(self.module).__name__}, {len(self._programs)} signature(s), "
                f"cache_size={self.cache_size})")


_RERUN = object()


def _on_cpu(inputs):
    return all(t.device.type == "cpu" for t in inputs)


def _module_tensors(module):
    """(qualified name, tensor) of the module's parameters and buffers
    (tensors held in its list and dict attributes included)."""
    return (list(type(module).named_parameters(module))
            + list(type(module).named_buffers(module)))


def _watch(module):
    """The storage versions of the module's parameters and buffers now."""
    return _cplan.VersionWatch([t for _, t in _module_tensors(module)])


def _check_aliasing(held, inputs):
    """Raise SharedMemoryError where an input is, or views the memory of, a
    tensor the module holds: the recording would see one buffer, and the
    plan read the module's tensor through whatever memory a later input
    has."""
    names = {}
    for name, t in held:
        names.setdefault(_cplan.tensor_info(t)[4], name)
    for i, t in enumerate(inputs):
        name = names.get(_cplan.tensor_info(t)[4]) if isinstance(t, Tensor) else None
        if name is not None:
            raise SharedMemoryError(f"compile: input {i} shares memory with the module's "
                                    f"{name} (it is {name} or a view of it): pass a copy "
                                    "(t.copy())")


def _check_module(module):
    for what in ("watch_points", "end_points"):
        nodes = getattr(module, what, None)
        if nodes:
            raise PlanError(f"compile: the module has {what.replace('_', ' ')} "
                            f"({', '.join(n.name for n in nodes)}): a plan returns the forward's "
                            f"outputs only; clear them (clear_{what}()) first")


def compile(module, *example_inputs, cache_size=4):
    """Compiles ``module`` (a TracedModule, usually optimized, or any
    Module) into a :class:`Plan` at the example inputs' signature.

    Args:
        module: the module to run, in eval mode.
        *example_inputs: Tensors (CPU) with the shapes, dtypes and strides
            the plan is for; the module runs once on them.
        cache_size: programs kept, one per input signature and thread
            count, each made on the first call that needs it; other calls
            run the module.

    Returns:
        A :class:`Plan`: ``plan(*inputs)`` gives what ``module(*inputs)``
        gives, bitwise (the same kernels run, with the same thread counts).

    Threads: each call uses the thread count the module would use now
    (``mgtrace.set_num_threads``, and fewer under load with
    ``set_adaptive_threads``), not the count at compile time: a program is
    recorded at one count and its kernels replayed with that count, and a
    call at another count runs (or first records) the program for that
    count, in the same bounded cache. A server that compiles and then calls
    ``set_num_threads(1)`` gets one-thread kernels on its next call, after
    one recording. Under adaptive threads a signature keeps one program
    below the configured count, run at any lowered count at least its own
    (the module docstring says how it is chosen). ``plan.step_threads(*inputs)`` lists each step's count.

    Raises:
        PlanError (a ValueError): the module cannot be a plan; the message
            names the module path and call (training-mode BatchNorm or
            Dropout, a random draw, a write into a parameter, buffer or
            input, a forward that rebinds, adds or appends module state,
            a data-dependent value, an example input that is or views a
            module tensor, watch or end points); the module is left as it
            was before the call.
        NoKernelError: inputs not on the CPU (plans on CUDA would replay as
            CUDA graphs; not built yet).
        TypeError: example inputs that are not Tensors.
    """
    return Plan(module, example_inputs, cache_size=cache_size)
