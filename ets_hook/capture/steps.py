"""Step-boundary detection: decides when one training step ends, from whatever the loop offers.

One authority decides at a time, so a boundary is never counted twice:

1. ``grad_scaler`` given: ``GradScaler.update()`` (called once per iteration, also when the scaler
   skips ``optimizer.step()`` on inf/NaN gradients).
2. ``optimizer`` given (one or several): a step ends once every given optimizer has stepped since
   the last boundary (two optimizers stepping per iteration make one step). ``hook.step()`` calls
   are then absorbed, except when a training forward but no optimizer step happened since the
   previous ``hook.step()``: that is an iteration whose optimizer step was skipped (e.g. by a
   GradScaler), and it counts. A second call in the same iteration (no forward since) does not.
3. No optimizer given: explicit ``hook.step()`` calls, from the first one on.
4. Neither: any optimizer's step (``register_optimizer_step_post_hook``; with several optimizers,
   once all optimizers seen so far and still alive have stepped: one re-created for a new stage
   replaces the old once that is freed; once an optimizer holding some of the model's
   parameters has stepped, one holding none of them is not the model's), else the root
   module's forward in training mode with grad enabled (a step runs from one such forward to
   the one ``forwards_per_step`` later: the gradient accumulation's micro-batches make one
   step). Until the first optimizer
   step, forwards decide; a loop with more forwards per optimizer step than it declared (two
   views of a batch, undeclared accumulation) gets those extra boundaries before its first one.

Forwards in eval mode, under ``no_grad``, inside a marked phase, inside an optimizer step
(LBFGS closures, Lightning's automatic optimization) or inside the backward (an activation
checkpoint's recompute) never end a step; when forwards mark the steps, the last one ends at
``finish_forward_step`` (the hook's close). Optimizer steps inside a marked phase are ignored too.

Step 0 starts at the job's first training forward (``on_first_activity``), a closure's
included: the root module's, or a direct child's where the loop never calls the root (a
LightningModule's ``training_step`` calling ``self.net(x)``; one-shot hooks on the children,
not on a compiled root). A deep copy or a pickle of the model or optimizer carries an inert
detector (``StepDetector.__deepcopy__``): an EMA copy's forwards are not the model's.

``torch.compile`` (checked with fullgraph=True, see ``tests/capture/test_compile_events.py``):

- Called as frames of their own (``Module.__call__`` calls a compiled module's hooks outside
  dynamo's trace), the hooks and everything they call run as plain Python: their code is marked
  for dynamo to skip (``_run_outside_dynamo``), so it never tries to compile them. This covers
  hooks on the ``OptimizedModule`` (``ETSHook(torch.compile(model))``, recommended), on a
  user-defined module compiled afterwards, and ``model.compile()``.
- Traced into a graph, the hooks return at once (``torch.compiler.is_compiling()``), reading none
  of the detector's state: no graph break, and no guards on that state (which would recompile the
  model at the first forward, around phases and at the window's end). This happens to the module
  hook when dynamo traces the hooked module's ``__call__``: a built-in module (``nn.Sequential``,
  ...) passed to ``torch.compile`` and hooked itself rather than its ``OptimizedModule``, or any
  model called inside a compiled function (a compiled train step). Its forwards are then invisible:
  step 0 starts at the hook's creation, ``FORWARD`` authority marks no steps (optimizer steps and
  ``hook.step()`` still do), ``saw_training_forward`` stays False, and ``remove_capture_hooks``
  leaves the hook in place (removing it would recompile). Inside a compiled optimizer step, the
  optimizer hooks of the given optimizers still run, eagerly, when every one's ``step`` breaks the
  graph anyway (torch.optim's built-ins but LBFGS: ``step_always_breaks_graph``); otherwise (LBFGS,
  custom optimizers, no ``optimizer`` given) such steps are not seen.
"""

from __future__ import annotations

import contextlib
import enum
import inspect
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from .input_shapes import InputShapeWatch

#: True while dynamo traces (``torch.compile``/``torch.export``), a constant False eagerly;
#: ``torch.compiler`` comes with ``import torch`` (``torch._dynamo`` does not, nor is it needed).
_is_compiling = torch.compiler.is_compiling


def _run_outside_dynamo(*functions: Callable[..., Any]) -> bool:
    """Have dynamo run ``functions``, and everything they call, as plain Python whenever they
    are called as frames of their own (e.g. from ``Module.__call__`` inside a compiled module's
    dynamo context), instead of tracing them; the frame-level half of ``torch.compiler.disable``
    (which would import ``torch._dynamo``, ~1.4 s). Calls that dynamo inlines into a graph it
    is tracing are not frames: see ``_is_compiling`` and ``_call_eagerly``.

    Args:
        functions: plain functions; their code objects are marked.

    Returns:
        Whether the marks were set (False: this torch lacks the private hook; nothing done).
    """
    try:
        from torch._C._dynamo import eval_frame

        skip = eval_frame._FrameAction.SKIP
        strategy = eval_frame._FrameExecStrategy(skip, skip)  # this frame, and frames it calls
        for function in functions:
            eval_frame.set_code_exec_strategy(function.__code__, strategy)
    except Exception:  # another torch: hooks may then be traced as frames (still no-ops)
        return False
    return True


def _updates_parameters_of(optimizer: Any, model: torch.nn.Module) -> bool:
    """Whether ``optimizer`` holds at least one of ``model``'s parameters (True when that
    cannot be told: an optimizer without the usual ``param_groups``)."""
    try:
        ids = {id(parameter) for parameter in model.parameters()}
        groups = optimizer.param_groups
        return any(id(parameter) in ids for group in groups for parameter in group["params"])
    except Exception:
        return True


def _in_backward() -> bool:
    """Whether this thread runs inside the autograd engine's backward (an activation
    checkpoint's recomputed forward: part of the step, never a new one)."""
    return torch._C._current_graph_task_id() != -1


def _is_compiled_module(model: torch.nn.Module) -> bool:
    """Whether ``model`` is compiled: a ``torch.compile`` wrapper (``OptimizedModule``, told by
    its ``_orig_mod`` without importing ``torch._dynamo``) or compiled in place
    (``model.compile()``)."""
    return (
        isinstance(getattr(model, "_orig_mod", None), torch.nn.Module)
        or getattr(model, "_compiled_call_impl", None) is not None
    )


def _forward_pre_hook_on(module: torch.nn.Module, hook: Callable[..., Any], **kwargs: Any) -> Any:
    """``module.register_forward_pre_hook(hook, **kwargs)``'s handle; None where the module
    takes no forward hooks (a ``torch.jit.script``ed module raises ``RuntimeError``; traced
    ones take them)."""
    try:
        return module.register_forward_pre_hook(hook, **kwargs)
    except RuntimeError:
        return None


def _call_eagerly(function: Callable[..., None], *args: Any) -> None:
    """``function(*args)``; called from code dynamo traces, it makes dynamo break the graph
    and run the call as plain Python (``_torchdynamo_disable``, as ``torch.compiler.disable``
    sets it). Only used where the graph breaks there anyway."""
    function(*args)


_call_eagerly._torchdynamo_disable = True  # type: ignore[attr-defined]


def _graph_breaking_step_code() -> Any:
    """The code of the wrapper torch.optim puts around built-in optimizers' ``step``
    (``_use_grad_for_differentiable``), which calls ``torch._dynamo.graph_break()`` twice: their
    compiled steps never make one graph. None when this torch has no such wrapper."""
    try:
        from torch.optim.optimizer import _use_grad_for_differentiable

        return _use_grad_for_differentiable(lambda self: None).__code__
    except Exception:
        return None


_GRAPH_BREAKING_STEP_CODE = _graph_breaking_step_code()


def step_always_breaks_graph(optimizer: Any, depth: int = 8) -> bool:
    """Whether dynamo always breaks the graph inside ``optimizer.step()``.

    True for torch.optim's built-in optimizers whose ``step`` goes through
    ``_use_grad_for_differentiable`` (SGD, Adam, AdamW, ...; not LBFGS): a compiled step of
    theirs is never one graph (``fullgraph=True`` fails without us), so running the step hooks
    eagerly there adds no graph break that matters and cannot make a compile fail.

    Args:
        optimizer: a ``torch.optim.Optimizer``.
        depth: ``__wrapped__`` links followed at most.

    Returns:
        Whether the graph-breaking wrapper is on ``type(optimizer).step``'s wrapper chain.
    """
    if _GRAPH_BREAKING_STEP_CODE is None:
        return False
    function = getattr(type(optimizer), "step", None)
    for _ in range(depth):
        if function is None:
            return False
        if getattr(function, "__code__", None) is _GRAPH_BREAKING_STEP_CODE:
            return True
        function = getattr(function, "__wrapped__", None)
    return False


class Authority(str, enum.Enum):
    """Which signal marks step boundaries; the value is the ``source`` passed to ``on_boundary``.

    ``FORWARD`` becomes ``ANY_OPTIMIZER`` at the first optimizer step, and either becomes
    ``EXPLICIT`` at the first ``hook.step()``; ``SCALER`` and ``OPTIMIZER`` never change.
    """

    SCALER = "grad_scaler"
    OPTIMIZER = "optimizer"
    EXPLICIT = "explicit"
    ANY_OPTIMIZER = "any_optimizer"
    FORWARD = "forward"


#: Wrappers (Accelerate's ``AcceleratedOptimizer``, Lightning's ``LightningOptimizer``, ...)
#: hold the real optimizer in one of these attributes and forward ``step()`` to it.
WRAPPED_OPTIMIZER_ATTRIBUTES = ("optimizer", "_optimizer")


def unwrap_optimizer(optimizer: Any, depth: int = 8) -> torch.optim.Optimizer | None:
    """The ``torch.optim.Optimizer`` inside ``optimizer``'s wrappers, or None.

    Args:
        optimizer: an optimizer, or a wrapper holding one (``WRAPPED_OPTIMIZER_ATTRIBUTES``),
            possibly several levels deep.
        depth: wrappers unwrapped at most.

    Returns:
        The optimizer itself, the wrapped one, or None when there is none.
    """
    for _ in range(depth + 1):
        inner = next(
            (
                getattr(optimizer, name)
                for name in WRAPPED_OPTIMIZER_ATTRIBUTES
                if getattr(optimizer, name, None) is not None
            ),
            None,
        )
        # The object torch calls the step hooks with owns their dicts. Wrappers do not, though
        # they pass as optimizers: Accelerate's AcceleratedOptimizer subclasses Optimizer without
        # running its __init__; Lightning Fabric's _FabricOptimizer takes a subclass of its
        # optimizer's class and forwards attribute reads (hooks registered through it land in the
        # inner one's dicts, and fire with the inner one); Lightning's LightningOptimizer copies
        # its optimizer's __dict__, sharing the very dicts.
        hooks = _own_step_hooks(optimizer)
        if hooks is not None and (inner is None or _own_step_hooks(inner) is not hooks):
            return optimizer
        if inner is None or inner is optimizer:
            return None
        optimizer = inner
    return None


def _own_step_hooks(optimizer: Any) -> Any:
    """``optimizer``'s own step pre-hook dict (in its instance ``__dict__``, not read through a
    wrapper's forwarding), or None when it is not an optimizer that holds one."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        return None
    try:
        return vars(optimizer).get("_optimizer_step_pre_hooks")
    except TypeError:  # no __dict__
        return None


def optimizer_list(optimizer: Any) -> list[torch.optim.Optimizer]:
    """``ETSHook``'s ``optimizer`` argument as a list of ``torch.optim.Optimizer``.

    Wrappers that forward ``step()`` to an optimizer they hold (Accelerate, Lightning) are
    unwrapped: the hook watches the real optimizer's steps, which the wrapper's call makes.

    Args:
        optimizer: None, an optimizer or a wrapper of one, or an iterable of those.

    Returns:
        The optimizers (empty for None).

    Raises:
        ValueError: ``optimizer`` (or an item of it) is neither an optimizer nor a wrapper of
            one, or is an empty list or tuple; the message names the value.
    """
    if optimizer is None:
        return []
    single = unwrap_optimizer(optimizer)
    if single is not None:
        return [single]
    # Only a list or tuple holds several: anything else (a string, a model, a dict, a
    # generator: the common slip model.parameters()) is named whole, not by its first item.
    items = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
    if not items:  # not None's "no optimizer": a list that was to hold them is still empty
        raise ValueError(
            f"optimizer must hold at least one optimizer, got an empty {type(optimizer).__name__}"
            " (None: steps marked by hook.step(), an optimizer's step or the training forward)"
        )
    optimizers = []
    for item in items:
        unwrapped = unwrap_optimizer(item)
        if unwrapped is None:
            raise ValueError(
                "optimizer must be a torch.optim.Optimizer, a wrapper holding one in "
                f"{' or '.join(WRAPPED_OPTIMIZER_ATTRIBUTES)}, or a list of them, got "
                f"{_describe_value(item)}"
            )
        optimizers.append(unwrapped)
    return optimizers


def _describe_value(value: Any) -> str:
    """``repr`` for short values; a type name for long ones (a model, a generator of tensors:
    their repr would dump weights into the message)."""
    if isinstance(value, torch.nn.Module):
        return f"a {type(value).__name__} model (pass its optimizer)"
    if inspect.isgenerator(value):
        return f"a generator ({getattr(value, '__name__', 'generator')}; pass the optimizer)"
    text = repr(value)
    return text if len(text) <= 80 else f"a {type(value).__name__}"


class StepDetector:
    """Installs the hooks that mark step boundaries and reports each one to ``on_boundary``.

    ``on_boundary(source)`` is called on the training thread, once per training step.
    ``on_first_activity()`` is called at the first training forward (the start of step 0).
    ``on_forward()`` is called at every training forward that did not itself end a step, while
    the module hook is installed (the hook uses it as a safe point to restart the profiler).
    Exceptions raised by these callbacks propagate into the training loop.

    Attributes:
        authority: the ``Authority`` deciding boundaries now (see the module docstring).
        in_phase: set by the caller while a marked non-training phase runs; boundaries,
            optimizer steps and forwards are ignored meanwhile.
        sees_forwards: whether the model's forwards are watched; False for a scripted
            (``torch.jit.script``) model, which takes no forward hooks: its steps are its
            optimizers' steps (or ``hook.step()``), and ``on_first_activity``/``on_forward``
            are never called.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizers: Sequence[torch.optim.Optimizer],
        on_boundary: Callable[[str], None],
        *,
        grad_scaler: Any = None,
        on_first_activity: Callable[[], None] | None = None,
        on_forward: Callable[[], None] | None = None,
        on_inputs_vary: Callable[[], None] | None = None,
        forwards_per_step: int = 1,
        on_new_optimizer: Callable[[int], None] | None = None,
        on_first_optimizer_step: Callable[[int], None] | None = None,
        on_repeated_optimizer: Callable[[int], None] | None = None,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        """Install the hooks for the authority the arguments select.

        Args:
            model: the root module; a forward pre-hook is installed on it.
            optimizers: the optimizers whose steps mark boundaries; empty: any optimizer's step
                (global hooks), else training forwards. Ignored when ``grad_scaler`` is given.
            on_boundary: called with the ``Authority`` value once per step boundary.
            grad_scaler: an object with an ``update()`` method (a ``GradScaler``); its
                ``update`` is wrapped on the instance until ``close()``.
            on_first_activity: called at the first training forward.
            on_forward: called at each later training forward that did not end a step.
            on_inputs_vary: called once when the training forwards' tensor inputs change shape
                beyond the batch dimension (``capture.input_shapes``); watched while the module
                hook is installed (up to the capture window's end), for at most
                ``WATCHED_FORWARDS`` forwards. None: not watched.
            forwards_per_step: training forwards per step where forwards mark the steps (the
                gradient accumulation's micro-batches per optimizer step; int >= 1).
            on_new_optimizer: with no optimizer given, called with the steps already ended by
                the optimizers seen before when another one first steps while they are alive
                (the others' steps alone ended those: a GAN's discriminator stepping twice
                before its generator's first step). None: not told.
            on_first_optimizer_step: with no optimizer given, called at the first optimizer
                step with the steps training forwards had ended before it, when there were
                any (several forwards per optimizer step: each was counted as a step until
                then). None: not told. Both notes come after that step's boundary.
            on_repeated_optimizer: with several optimizers given, called once, the first time
                one of them steps again before every given one has stepped (the step then
                holds several of its steps), with its index in ``optimizers``. None: not told.
            on_error: called with an error raised by this detector's own bookkeeping (or a
                callback) inside the forward and optimizer hooks torch calls; what it raises
                reaches the loop. None: the error is raised there.

        Raises:
            ValueError: ``forwards_per_step`` is not an int >= 1.
        """
        if (
            isinstance(forwards_per_step, bool)
            or not isinstance(forwards_per_step, int)
            or forwards_per_step < 1
        ):
            raise ValueError(f"forwards_per_step must be an int >= 1, got {forwards_per_step!r}")
        self._forwards_per_step = forwards_per_step
        self._forwards_in_step = 0  # training forwards since the last boundary (FORWARD)
        self._model = model
        self._optimizers = list(optimizers)
        self._given_ids = frozenset(id(optimizer) for optimizer in self._optimizers)
        self._on_boundary = on_boundary
        self._on_first_activity = on_first_activity
        self._on_forward = on_forward
        self._on_inputs_vary = on_inputs_vary
        self._on_new_optimizer = on_new_optimizer
        self._on_first_optimizer_step = on_first_optimizer_step
        self._on_repeated_optimizer = on_repeated_optimizer
        self._on_error = on_error
        self._optimizer_boundaries = 0  # ANY_OPTIMIZER boundaries so far
        self._forward_boundaries = 0  # FORWARD boundaries so far
        self._shape_watch = InputShapeWatch() if on_inputs_vary is not None else None
        self._scaler = grad_scaler
        self._handles: list[Any] = []
        self._pre_handles: list[Any] = []  # only needed while the forward hook is installed
        self._forward_handle: Any = None
        self._scaler_original_update: Any = None
        self._scaler_wrapper: Any = None

        self.in_phase = False
        self._in_optimizer_step = 0
        self._stepped_since_boundary: set[int] = set()
        # ANY_OPTIMIZER: the optimizers seen stepping, held weakly: one the loop dropped (an
        # optimizer re-created for a new stage) stops being waited for once it is freed.
        self._seen_optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._kept_optimizers: list[Any] = []
        self._seen_ids: set[int] = set()  # their ids, rebuilt when one is added or freed
        # Whether each optimizer seen updates some of the model's parameters (_foreign).
        self._owns_parameters: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
        self._own_optimizer_seen = False
        self._steps_before_own = 0  # boundaries foreign optimizers ended before the model's
        self._optimizer_since_explicit = False
        self._forward_since_explicit = False
        self._explicit_absorbed = 0
        self._forward_started = False
        self._root_forward_seen = False
        self._active = True
        # Inside a compiled optimizer step, run the optimizer hooks eagerly (a graph break)
        # only where the step breaks the graph anyway; elsewhere they are no-ops there.
        self._eager_in_compiled_steps = bool(self._optimizers) and all(
            step_always_breaks_graph(optimizer) for optimizer in self._optimizers
        )

        if grad_scaler is not None:
            self.authority = Authority.SCALER
            self._wrap_scaler(grad_scaler)
        elif self._optimizers:
            self.authority = Authority.OPTIMIZER
            for optimizer in self._optimizers:
                self._pre_handles.append(optimizer.register_step_pre_hook(self._optimizer_pre))
                self._handles.append(optimizer.register_step_post_hook(self._optimizer_post))
        else:
            self.authority = Authority.FORWARD
            self._pre_handles.append(register_optimizer_step_pre_hook(self._optimizer_pre))
            self._handles.append(register_optimizer_step_post_hook(self._optimizer_post))
        # A TorchScript root takes no forward hooks: its steps are the optimizers' (or
        # hook.step()'s), and step 0 starts at the hook's creation.
        self._forward_handle = _forward_pre_hook_on(model, self._forward_pre, with_kwargs=True)
        self.sees_forwards = self._forward_handle is not None
        # The root's forward may never run: a LightningModule's training_step calling
        # self.net(x), a loop calling model.backbone(x). Then a direct child's first training
        # forward starts step 0. These hooks go at the first training forward of either. (Not on
        # a compiled root: its own hook always runs, and hooks inside its graph must stay; nor
        # on TorchScript children.)
        self._child_handles: list[Any] = []
        if on_first_activity is not None and self.sees_forwards and not _is_compiled_module(model):
            handles = (
                _forward_pre_hook_on(child, self._child_forward_pre) for child in model.children()
            )
            self._child_handles = [handle for handle in handles if handle is not None]

    def __deepcopy__(self, memo: dict[int, Any]) -> StepDetector:
        """A deep copy of the model (an EMA / mean-teacher copy, ``AveragedModel``) or of an
        optimizer copies their hooks, bound to this detector: the copy's get an inert one
        (its callbacks are this hook's: the copy's forwards would count as its steps)."""
        return _inert_detector()

    def __reduce__(self) -> tuple[Callable[[], StepDetector], tuple[()]]:
        """Pickled with the model (``torch.save(model)``) as an inert detector likewise."""
        return _inert_detector, ()

    # -- hooks -----------------------------------------------------------------------------

    def _wrap_scaler(self, scaler: Any) -> None:
        original = scaler.update
        # Put back on close: the instance's own attribute when it had one (a user's wrapper),
        # else nothing (the class method shows through again).
        self._scaler_original_update = vars(scaler).get("update")

        def update(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if not _is_compiling() and self._active and not self.in_phase:
                self._on_boundary(Authority.SCALER.value)
            return result

        scaler.update = update
        self._scaler_wrapper = update

    # The registered hooks (marked by _run_outside_dynamo below) do nothing while dynamo traces
    # them (see the module docstring): they read no state, so no guards and no graph breaks.

    def _failed(self, exc: Exception) -> None:
        """An error in this detector's own bookkeeping inside a hook torch called: handed to
        ``on_error`` (which may raise what must reach the loop), else raised."""
        if self._on_error is None:
            raise exc
        self._on_error(exc)

    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if _is_compiling():
            if self._eager_in_compiled_steps:
                _call_eagerly(self._enter_optimizer_step)
            return
        self._enter_optimizer_step()

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if _is_compiling():
            if self._eager_in_compiled_steps:
                _call_eagerly(self._optimizer_stepped, optimizer)
            return
        try:
            self._optimizer_stepped(optimizer)
        except Exception as exc:
            self._failed(exc)

    def _foreign(self, optimizer: Any) -> bool:
        """With no optimizer given: whether ``optimizer``'s steps are not this model's training
        (ignored). An optimizer that updates none of the model's parameters (another model's,
        a linear probe's, a later run's in the same process) is foreign once one that updates
        some has stepped; until then every optimizer counts (one that steps copies of the
        parameters, e.g. fp32 master weights, is then the only one there is). The first
        optimizer of the model drops the foreign ones seen before it from those awaited."""
        owns = self._owns_parameters.get(optimizer)
        if owns is None:
            owns = _updates_parameters_of(optimizer, self._model)
            with contextlib.suppress(TypeError):  # a class refusing weak references: asked again
                self._owns_parameters[optimizer] = owns
        if owns:
            if not self._own_optimizer_seen:
                self._own_optimizer_seen = True
                if self._drop_seen(lambda seen: not self._owns_parameters.get(seen, True)):
                    # Steps ended at the foreign ones' steps alone: said as a late joiner is.
                    self._steps_before_own = self._optimizer_boundaries
            return False
        return self._own_optimizer_seen

    def _drop_seen(self, drop: Callable[[Any], bool]) -> int:
        """Forget the seen optimizers ``drop`` selects (ANY_OPTIMIZER's awaited set); returns
        how many."""
        dropped = 0
        for seen in [*self._seen_optimizers, *self._kept_optimizers]:
            if drop(seen):
                dropped += 1
                self._seen_optimizers.discard(seen)
                self._kept_optimizers = [k for k in self._kept_optimizers if k is not seen]
        self._seen_ids = {id(seen) for seen in (*self._seen_optimizers, *self._kept_optimizers)}
        self._stepped_since_boundary &= self._seen_ids
        return dropped

    def _enter_optimizer_step(self) -> None:
        self._in_optimizer_step += 1

    def _optimizer_stepped(self, optimizer: Any) -> None:
        self._in_optimizer_step = max(0, self._in_optimizer_step - 1)
        if not self._active or self.in_phase:
            return
        if self.authority is not Authority.OPTIMIZER and self._foreign(optimizer):
            return
        self._optimizer_since_explicit = True
        key = id(optimizer)
        # What to tell once the boundary is done.
        forward_steps, joined_after, self._steps_before_own = 0, self._steps_before_own, 0
        if self.authority is Authority.FORWARD:
            self.authority = Authority.ANY_OPTIMIZER
            forward_steps = self._forward_boundaries
        if self.authority is Authority.ANY_OPTIMIZER:
            expected = self._seen_ids
            seen_now = len(self._seen_optimizers) + len(self._kept_optimizers)
            if key not in expected or len(expected) != seen_now:  # a new one, or one freed
                if key not in expected and len(expected) == seen_now and expected:
                    joined_after = self._optimizer_boundaries  # others alive: it joined them
                try:
                    self._seen_optimizers.add(optimizer)
                except TypeError:  # a class that refuses weak references: kept for good
                    if all(kept is not optimizer for kept in self._kept_optimizers):
                        self._kept_optimizers.append(optimizer)
                expected = self._seen_ids = {
                    id(seen) for seen in (*self._seen_optimizers, *self._kept_optimizers)
                }
        elif self.authority is Authority.OPTIMIZER:
            expected = self._given_ids
            if key in self._stepped_since_boundary and self._on_repeated_optimizer is not None:
                told, self._on_repeated_optimizer = self._on_repeated_optimizer, None
                index = next((i for i, o in enumerate(self._optimizers) if id(o) == key), None)
                if index is not None:
                    told(index)
        else:
            return
        self._stepped_since_boundary.add(key)
        if expected <= self._stepped_since_boundary:
            self._stepped_since_boundary.clear()
            if self.authority is Authority.ANY_OPTIMIZER:
                self._optimizer_boundaries += 1
            self._on_boundary(self.authority.value)
        if forward_steps and self._on_first_optimizer_step is not None:
            self._on_first_optimizer_step(forward_steps)
        if joined_after and self._on_new_optimizer is not None:
            self._on_new_optimizer(joined_after)

    def _forward_pre(self, module: Any, args: Any, kwargs: Any) -> None:
        if _is_compiling():
            return
        try:
            self._training_forward_pre(module, args, kwargs)
        except Exception as exc:
            self._failed(exc)

    def _training_forward_pre(self, module: Any, args: Any, kwargs: Any) -> None:
        if not self._training_forward(module):
            return
        self._root_forward_seen = True
        if self._in_optimizer_step:
            # A closure's forward (Lightning's automatic optimization, LBFGS): never a
            # boundary, but the job's first one starts step 0.
            self._start_training()
            return
        self._forward_since_explicit = True
        watch = self._shape_watch
        if watch is not None and watch.active and watch.observe(args, kwargs):
            self._on_inputs_vary()  # type: ignore[misc]  # set with the watch
        self._forwards_in_step += 1
        if not self._forward_started:
            self._start_training()
        elif (
            self.authority is Authority.FORWARD and self._forwards_in_step > self._forwards_per_step
        ):
            self._forwards_in_step = 1
            self._forward_boundaries += 1
            self._on_boundary(Authority.FORWARD.value)
            return
        if self._on_forward is not None:
            self._on_forward()

    def _child_forward_pre(self, module: Any, args: Any) -> None:
        """A direct child's forward before the root's first training forward: the loop calls a
        part of the model, not the model (see ``__init__``); its first training forward starts
        step 0. Forwards are not counted from children (two of them in one iteration would
        look like two steps)."""
        if _is_compiling() or self._forward_started or not self._training_forward(module):
            return
        if not self._in_optimizer_step:
            self._forward_since_explicit = True
        self._start_training()

    def _start_training(self) -> None:
        """The job's first training forward: step 0 starts (``on_first_activity``), and the
        children's one-shot hooks go."""
        if self._forward_started:
            return
        self._forward_started = True
        self._drop_child_hooks()
        if self._on_first_activity is not None:
            self._on_first_activity()

    def _training_forward(self, module: Any) -> bool:
        """Whether a forward of ``module`` now is one of the loop's training forwards (inside
        an optimizer step too: a closure's): not in a marked phase or the backward (an
        activation checkpoint's recompute), in training mode with grad enabled, while
        active."""
        return (
            self._active
            and not self.in_phase
            and module.training
            and torch.is_grad_enabled()
            and not _in_backward()
        )

    def _drop_child_hooks(self) -> None:
        for handle in self._child_handles:
            handle.remove()
        self._child_handles = []

    # -- explicit steps --------------------------------------------------------------------

    def explicit_step(self) -> None:
        """``hook.step()``: count a boundary unless another authority already marked it.

        With ``FORWARD``/``ANY_OPTIMIZER`` authority the first call switches to ``EXPLICIT``
        and counts unless an optimizer has stepped (then it is the automatic boundary's twin);
        with ``EXPLICIT`` every call counts; with ``OPTIMIZER`` a call counts only when a training
        forward but no optimizer step happened since the previous call (a skipped optimizer
        step; the very first call never counts, nor does a repeated call); with ``SCALER`` calls
        never count. Ignored inside a marked phase and after ``close()``.
        """
        if not self._active or self.in_phase:
            return
        if self.authority in (Authority.FORWARD, Authority.ANY_OPTIMIZER):
            # First explicit call: from now on only hook.step() marks steps. If an automatic
            # boundary just happened (an optimizer stepped since), this call is its twin.
            self.authority = Authority.EXPLICIT
            if self._optimizer_since_explicit:
                self._optimizer_since_explicit = False
                return
            self._on_boundary(Authority.EXPLICIT.value)
        elif self.authority is Authority.EXPLICIT:
            self._on_boundary(Authority.EXPLICIT.value)
        else:  # OPTIMIZER / SCALER: absorbed unless the iteration's optimizer step was skipped
            skipped_step = (
                self.authority is Authority.OPTIMIZER
                and not self._optimizer_since_explicit
                and self._forward_since_explicit
                and self._explicit_absorbed > 0
            )
            self._optimizer_since_explicit = False
            self._forward_since_explicit = False
            if skipped_step:
                self._stepped_since_boundary.clear()
                self._on_boundary(Authority.EXPLICIT.value)
            else:  # the optimizer's twin, a repeated call, or a call before any step
                self._explicit_absorbed += 1
            if self.authority is Authority.OPTIMIZER:
                self._watch_forwards()

    def finish_forward_step(self) -> None:
        """The job ends (``close()``): with ``FORWARD`` authority the step its last training
        forward began ends now (such a step ends at the next forward, which never comes), when
        that forward completed its step's forwards (all micro-batches)."""
        if (
            self._active
            and not self.in_phase
            and self.authority is Authority.FORWARD
            and self._forwards_in_step >= self._forwards_per_step
        ):
            self._forwards_in_step = 0
            self._forward_boundaries += 1
            self._on_boundary(Authority.FORWARD.value)

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def saw_training_forward(self) -> bool:
        """Whether the module hook has seen a training forward. False after optimizer steps
        means forwards are invisible: the hook was compiled into the model's graph (see the
        module docstring) or the loop never calls the hooked module."""
        return self._forward_started

    @property
    def only_parts_called(self) -> bool:
        """Whether training forwards ran in the model's children but never in the model itself
        (the loop calls a part of it, or ``model.forward`` directly): forwards cannot mark
        steps then."""
        return self._forward_started and not self._root_forward_seen

    @property
    def absorbed_explicit_steps(self) -> int:
        """``hook.step()`` calls that ended no step (the optimizers' authority: twins of their
        steps, repeated calls, calls before any training forward)."""
        return self._explicit_absorbed

    @property
    def needs_forward_hook(self) -> bool:
        """Whether forwards still matter after the window: they mark the steps (authority
        ``FORWARD``), or tell a skipped optimizer step from a repeated ``hook.step()``."""
        return self.authority is Authority.FORWARD or (
            self.authority is Authority.OPTIMIZER and self._explicit_absorbed > 0
        )

    def _watch_forwards(self) -> None:
        """(Re)install the module hook and the optimizer pre-hooks if the window removed them."""
        if self._forward_handle is not None or not self._active or not self.sees_forwards:
            return
        self._forward_handle = self._model.register_forward_pre_hook(
            self._forward_pre, with_kwargs=True
        )
        for optimizer in self._optimizers:
            self._pre_handles.append(optimizer.register_step_pre_hook(self._optimizer_pre))

    def remove_capture_hooks(self) -> None:
        """After the capture window: drop the module hook unless forwards mark the steps.

        Without the module hook the optimizer pre-hooks go too (they only served to ignore
        forwards inside optimizer steps); ``on_first_activity``/``on_forward`` stop being called.
        A module hook that never saw a training forward stays (until ``close()``): it may have
        been compiled into the model's graph, where removing it would make dynamo recompile the
        model; where it runs at all it returns at once.
        """
        if (
            self._forward_handle is not None
            and not self.needs_forward_hook
            and self._forward_started
        ):
            self._forward_handle.remove()
            self._forward_handle = None
        if self._forward_handle is None:
            # Pre-hooks only served to ignore forwards inside optimizer steps.
            for handle in self._pre_handles:
                handle.remove()
            self._pre_handles.clear()
            self._in_optimizer_step = 0

    def close(self) -> None:
        """Remove every hook this detector installed; safe to call twice; never raises.

        The scaler's wrapper is removed by deleting the instance attribute ``update``, which
        exposes the class method again.
        """
        self._active = False
        for handle in [*self._handles, *self._pre_handles]:
            with contextlib.suppress(Exception):
                handle.remove()
        self._handles.clear()
        self._pre_handles.clear()
        if self._forward_handle is not None:
            with contextlib.suppress(Exception):
                self._forward_handle.remove()
            self._forward_handle = None
        with contextlib.suppress(Exception):
            self._drop_child_hooks()
        wrapper, self._scaler_wrapper = self._scaler_wrapper, None
        # Only undo our own wrapper, and only while nobody wrapped it again since.
        if wrapper is not None and vars(self._scaler).get("update") is wrapper:
            with contextlib.suppress(Exception):
                if self._scaler_original_update is not None:
                    self._scaler.update = self._scaler_original_update
                else:
                    del self._scaler.update  # the class method shows through again
        self._scaler_original_update = None


def _inert_detector() -> StepDetector:
    """A detector whose hooks return at once (copies of the model, ``StepDetector.__deepcopy__``)
    and that installs nothing."""
    detector = StepDetector.__new__(StepDetector)
    detector._active = False
    detector._forward_started = True
    detector._in_optimizer_step = 0
    detector._eager_in_compiled_steps = False
    detector._child_handles = []
    detector._root_forward_seen = True
    detector.in_phase = False
    detector.sees_forwards = False
    detector._explicit_absorbed = 0
    detector._on_error = None
    return detector


_run_outside_dynamo(
    StepDetector._forward_pre,
    StepDetector._child_forward_pre,
    StepDetector._optimizer_pre,
    StepDetector._optimizer_post,
    _call_eagerly,
)


class NoSteps:
    """The step detector of a disabled hook (``ETS_HOOK_DISABLE``): installs nothing, marks
    nothing; the same methods as ``StepDetector``."""

    in_phase = False
    only_parts_called = False
    sees_forwards = False
    absorbed_explicit_steps = 0

    def explicit_step(self) -> None:
        """Ignored."""

    def remove_capture_hooks(self) -> None:
        """Nothing to remove."""

    def finish_forward_step(self) -> None:
        """No step to end."""

    def close(self) -> None:
        """Nothing to remove."""
