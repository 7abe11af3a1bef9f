"""What SGD and AdamW share: the parameter list, per-parameter state, device tensor lists, state_dict.

The parameters come as a list or, as PyTorch takes them, as groups that may set their own weight decay (e.g.
none on batch norm's scales and shifts). Once placed, they are grouped by the dtype of their low-precision copies
and their weight decay, each group's masters, gradients, state and copies held in ops.multi_tensor.TensorLists
built once, so a step is one kernel launch per group whatever the number of tensors. On the host the lists are
reference.multi_tensor's, which the same functions hand to the reference ops. A step has a host half
(prepare_step: count the step, write the hyperparameters a schedule moves into a small device array, one tiny
launch) and a device half (launch_step: the update kernels, which read them there), so the device half can be
captured in a CUDA graph and replayed while the schedule keeps changing them; step() is both.
"""

import numpy as np

from .. import reference
from .._core.placement import host_copy, native_dtype
from ..nn.params import Parameter
from ..ops import multi_tensor
from ..ops.multi_tensor import _non_negative


class _Group:
    def __init__(self, indices, params, state, names, placement, weight_decay):
        # A native list holds a device table of its arrays' pointers; host arrays go in the reference's lists.
        tensor_list = multi_tensor.TensorList if placement.on_gpu else reference.multi_tensor.TensorList
        self.indices = indices
        self.weight_decay = weight_decay  # None: the optimizer's
        self.params = tensor_list([p.data for p in params])
        self.grads = tensor_list([p.grad for p in params])
        self.state = {name: tensor_list([state[name][i] for i in indices]) for name in names}
        low = [p.low for p in params]
        self.copies = None if low[0] is None else tensor_list(low, dtype=native_dtype(low[0]))


class Optimizer:
    state_names = ()  # per-parameter state arrays, e.g. ("momentum_buffer",)
    hyperparameters = ()  # python scalars saved in state_dict, e.g. ("lr", "momentum")

    def __init__(self, params, lr):
        self.params, self._decay_of = _parameters(params)
        self.lr = _non_negative(lr, "lr")
        self.step_count = 0
        self.state = None  # {name: [array per parameter, where they live]}, created with the tensor lists
        self._pending_state = {}  # {name: [host array]} loaded before the parameters were placed
        self.placement = None  # the parameters' Placement, once they have one
        self._groups = None
        self._grads = None  # use_gradients(): a TensorList per group read in place of the parameters' grads
        self._hyper = None  # master-dtype array: the values of device_hyperparameters(), see prepare_step

    # -- device state ----------------------------------------------------------------------------------------
    def _ready(self) -> bool:
        """Whether the parameters are placed (the tensor lists are built on the first call that finds them so)."""
        if self._groups is not None:
            return True
        placements = {p.placement for p in self.params}
        if None in placements:
            if len(placements) > 1:
                raise RuntimeError(
                    "optimizer: some parameters are placed and some are not; call cuda() (or to_host()) on "
                    "the model(s) that own them"
                )
            return False
        if len(placements) > 1:
            where = ", ".join(sorted(map(str, placements)))
            raise RuntimeError(f"optimizer: the parameters live in different places ({where})")
        where = self.placement = placements.pop()
        master = where.master_dtype
        self.state = {}
        for name in self.state_names:
            pending = self._pending_state.get(name)
            self.state[name] = [
                where.array(pending[i], master) if pending else where.xp.zeros(p.shape, dtype=master)
                for i, p in enumerate(self.params)
            ]
        self._pending_state = {}
        groups = {}
        for i, p in enumerate(self.params):
            key = (None if p.low is None else np.dtype(p.low.dtype).str, self._decay_of.get(id(p)))
            groups.setdefault(key, []).append(i)
        self._groups = [
            _Group(idx, [self.params[i] for i in idx], self.state, self.state_names, where, decay)
            for (_, decay), idx in groups.items()
        ]
        self._hyper = where.xp.zeros((len(self.device_hyperparameters()),), dtype=master)
        self._device_state_ready()
        return True

    def _device_state_ready(self) -> None:
        """Hook: create further device state once the parameters are placed (self.placement)."""

    def device_hyperparameters(self) -> tuple:
        """The hyperparameters the kernels read from the device (as floats, in the order of the device array)."""
        return (self.lr,)

    def hyperparameter_on_device(self, index: int):
        """View of one entry of the device hyperparameter array, shape (1,), as the kernels take it."""
        return self._hyper[index : index + 1]

    def _require_ready(self):
        if not self._ready():
            raise RuntimeError(
                "optimizer: parameters are not on the GPU (or the host) yet; run a forward pass, model.cuda() or "
                "model.to_host()"
            )

    def grad_lists(self) -> list:
        """The gradient TensorLists (one per group) the update reads, e.g. for multi_tensor.check_finite."""
        self._require_ready()
        return list(self._grads) if self._grads is not None else [g.grads for g in self._groups]

    def group_params(self) -> list:
        """The parameters of each group, in the order of its tensor lists."""
        self._require_ready()
        return [[self.params[i] for i in g.indices] for g in self._groups]

    def use_gradients(self, lists) -> None:
        """Read the gradients from `lists` (a TensorList per group, shaped as group_params(); fp32, fp16 or bf16
        entries) instead of the parameters' grads, until use_gradients(None). For DirectGradients."""
        self._require_ready()
        if lists is not None:
            lists = list(lists)
            shapes = [[p.shape for p in params] for params in self.group_params()]
            if [[tuple(a.shape) for a in lst] for lst in lists] != shapes:
                raise ValueError("use_gradients: expected one list per group with its parameters' shapes")
        self._grads = lists

    def unscale_grads(self, inv_scale) -> None:
        """grad *= inv_scale (a device array of shape (1,)) for every parameter: one launch per parameter
        arena wholly owned by this optimizer (normally one), one per parameter otherwise."""
        self._require_ready()
        if self._grads is not None:
            raise RuntimeError("unscale_grads: the update reads the lists of use_gradients(), not the grads")
        mine = {id(p) for p in self.params}
        arenas = {}
        for p in self.params:
            arenas.setdefault(id(p.arena), p.arena)
        for arena in arenas.values():
            if arena is not None and all(id(q) in mine for q in arena.params):
                arena.unscale_grads(inv_scale)
            else:
                for p in self.params:
                    if p.arena is arena:
                        self.placement.xp.multiply(p.grad, inv_scale, out=p.grad)

    def zero_grad(self) -> None:
        """Zero every gradient in place (one launch per group; nothing to do before the first forward)."""
        if self._ready():
            for g in self._groups:
                multi_tensor.zero_(g.grads)

    def step(self, found_inf=None, inv_scale=None) -> None:
        """One update of every parameter: prepare_step() then launch_step(found_inf, inv_scale)."""
        self.prepare_step()
        self.launch_step(found_inf, inv_scale)

    def prepare_step(self) -> None:
        """The host half of a step: count it and write device_hyperparameters() to the device (one launch, on
        the current stream, ordered before the update kernels). Never inside a CUDA-graph capture."""
        self._require_ready()
        self.step_count += 1
        multi_tensor.write_scalars(self._hyper, self.device_hyperparameters())

    def launch_step(self, found_inf=None, inv_scale=None) -> None:
        """The device half: the update kernels, one launch per group, reading the hyperparameters written by the
        last prepare_step(); allocates nothing and never synchronises, so it can be captured in a CUDA graph.

        found_inf: optional device int32 array of shape (1,); when nonzero the kernels skip the whole update
        (GradScaler). inv_scale: optional float32 (1,) device array the gradients are multiplied by first
        (GradScaler's 1/scale, fused into the update instead of a separate pass)."""
        self._require_ready()
        for g, grads in zip(self._groups, self.grad_lists(), strict=True):
            shared = dict(lr=self.hyperparameter_on_device(0), inv_scale=1.0 if inv_scale is None else inv_scale,
                          found_inf=found_inf, model_copies=g.copies)
            self._launch(g, grads, shared)

    def group_weight_decay(self, group) -> float:
        """The weight decay of a group's parameters: its own where the parameter groups set one."""
        return self.weight_decay if group.weight_decay is None else group.weight_decay

    def _launch(self, group, grads, shared: dict):
        """One group's fused update reading `grads`; `shared` holds the keyword arguments every multi_tensor update
        takes (the device learning rate, inv_scale, found_inf, model_copies)."""
        raise NotImplementedError

    def set_momentum(self, value: float) -> None:
        """Used by OneCycleSchedule's momentum cycling (SGD: momentum; AdamW: beta1)."""
        raise NotImplementedError

    # -- state_dict ------------------------------------------------------------------------------------------
    def state_header(self) -> dict:
        """The scalars of state_dict(): {'type', hyperparameters..., 'step'}."""
        out = {"type": type(self).__name__, "step": self.step_count}
        out.update({k: _plain(getattr(self, k)) for k in self.hyperparameters})
        return out

    def state_sources(self) -> dict:
        """{'<state>.<i>': (array, to_host)} per parameter, uncopied (device arrays once placed, else the host
        values a load left pending, or zeros): what state_dict() copies."""
        out = {}
        for name in self.state_names:
            if self.state is not None:
                arrays = self.state[name]
            elif name in self._pending_state:
                arrays = self._pending_state[name]
            else:
                arrays = [np.zeros(p.shape, np.float32) for p in self.params]
            out.update({f"{name}.{i}": (a, _as_float32) for i, a in enumerate(arrays)})
        return out

    def state_dict(self) -> dict:
        """{'type', hyperparameters..., 'step', '<state>.<i>': NumPy array per parameter} (parameters() order;
        arrays in the parameters' own layout, so load into a model of the same layout)."""
        out = self.state_header()
        out.update({k: to_host(host_copy(a)) for k, (a, to_host) in self.state_sources().items()})
        return out

    def load_state_dict(self, state: dict) -> None:
        kind = state.get("type", type(self).__name__)
        kind = kind.item() if isinstance(kind, np.ndarray) else kind
        if kind != type(self).__name__:
            raise ValueError(f"load_state_dict: state of a {kind}, not a {type(self).__name__}")
        arrays = {}
        for name in self.state_names:
            arrays[name] = []
            for i, p in enumerate(self.params):
                key = f"{name}.{i}"
                if key not in state:
                    raise KeyError(f"load_state_dict: missing {key}")
                a = np.asarray(state[key], dtype=np.float32)
                if a.shape != p.shape:
                    raise ValueError(f"load_state_dict: {key}: expected shape {p.shape}, got {a.shape}")
                arrays[name].append(a)
        for k in self.hyperparameters:
            if k in state:
                value = state[k]
                value = value.tolist() if isinstance(value, np.ndarray) else value
                setattr(self, k, tuple(value) if isinstance(value, list) else value)
        self.step_count = int(state.get("step", 0))
        if self.state is not None:
            for name, values in arrays.items():
                for dst, a in zip(self.state[name], values, strict=True):
                    self.placement.xp.copyto(dst, self.placement.array(a, dst.dtype))
        else:
            self._pending_state = arrays

    def __repr__(self):
        hp = ", ".join(f"{k}={getattr(self, k)}" for k in self.hyperparameters)
        return f"{type(self).__name__}({len(self.params)} parameters, {hp}, step={self.step_count})"


def _parameters(params) -> tuple[list, dict]:
    """(the distinct Parameters in order, {id(parameter): weight decay} for those whose group sets one) of a list
    of Parameters or, as PyTorch takes them, of groups: dicts of 'params' and optionally 'weight_decay'."""
    params = list(params)
    groups = params if params and all(isinstance(g, dict) for g in params) else [{"params": params}]
    group_of, unique, decay_of = {}, [], {}
    for gi, group in enumerate(groups):
        where = "params" if len(groups) == 1 and group.keys() == {"params"} else f"params[{gi}]"
        unknown = sorted(set(group) - {"params", "weight_decay"})
        if unknown or "params" not in group:
            raise ValueError(f"{where}: a parameter group takes 'params' and optionally 'weight_decay', got "
                             f"{sorted(group)}")
        decay = _non_negative(group["weight_decay"], f"{where}.weight_decay") if "weight_decay" in group else None
        for p in group["params"]:
            if not isinstance(p, Parameter):
                raise TypeError(f"{where}: expected resnet_native Parameters (model.parameters()), got "
                                f"{type(p).__name__}")
            if id(p) in group_of:
                if group_of[id(p)] != gi:
                    raise ValueError(f"{where}: a parameter is also in params[{group_of[id(p)]}]")
                continue
            group_of[id(p)] = gi
            unique.append(p)
            if decay is not None:
                decay_of[id(p)] = decay
    if not unique:
        raise ValueError("params: empty parameter list")
    return unique, decay_of


def _as_float32(a):
    return np.asarray(a, np.float32)


def _plain(value):
    return tuple(float(v) for v in value) if isinstance(value, tuple) else value
