"""The small base class every layer and model derives from: a tree of named children with parameters.

It provides what a torchvision module provides and nothing more: named_parameters(), state_dict() and
load_state_dict() with the same names, order and (torch) array shapes, train()/eval(), and placement: cuda() or
to_host() moves the whole tree's parameters into one ParameterArena there and its buffers with them (see
_core/placement.py). Forward and backward are each layer's own explicit methods.
"""

import numpy as np

from ..._core import placement as placements
from ..._core.buffers import BufferCache
from ..params import Parameter, ParameterArena


class Module:
    def __init__(self):
        self._children = {}  # name -> Module, in registration (= torchvision state_dict) order
        self._params = {}  # name -> Parameter owned by this module
        self._buffers = BufferCache()
        self.training = True
        self.placement = None  # where this module's arrays live, once placed (cuda() / to_host())

    # -- tree ------------------------------------------------------------------------------------------------
    def add_module(self, name: str, module: "Module") -> "Module":
        self._children[name] = module
        return module

    def add_parameter(self, name: str, value) -> Parameter:
        param = Parameter(value, name=name)
        self._params[name] = param
        return param

    def named_children(self):
        return list(self._children.items())

    def named_modules(self, prefix: str = ""):
        """(dotted name, module) for this module and every descendant, parents first."""
        out = [(prefix, self)]
        for name, child in self._children.items():
            out.extend(child.named_modules(f"{prefix}{name}."))
        return out

    def named_parameters(self, prefix: str = ""):
        """(torchvision name, Parameter) for every parameter in the tree, in state_dict order."""
        return [(p + n, param) for p, m in self.named_modules(prefix) for n, param in m._params.items()]

    def parameters(self) -> list:
        return [param for _, param in self.named_parameters()]

    def frozen_parameters(self) -> list:
        """This module's own parameters whose gradient its backward does not compute (none here)."""
        return []

    def trainable_parameters(self) -> list:
        """parameters() less every layer's frozen_parameters(): what an optimizer should hold, since a frozen
        weight's gradient is never written and weight decay or momentum would still move it."""
        frozen = {id(p) for _, m in self.named_modules() for p in m.frozen_parameters()}
        return [p for p in self.parameters() if id(p) not in frozen]

    def num_parameters(self) -> int:
        return sum(p.size for p in self.parameters())

    # -- modes and device ------------------------------------------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        for _, m in self.named_modules():
            m.training = bool(mode)
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def cuda(self) -> "Module":
        """Place the tree on the current GPU: cupy arrays, the native ops (once; see place())."""
        return self.place(placements.gpu())

    def to_host(self, dtype=np.float64) -> "Module":
        """Place the tree on the host: NumPy masters, gradients, buffers and fp32/tf32 activations in `dtype`
        (float64, or float32 as on the GPU; fp16 and bf16 models keep float16 / bf16 activations), and the float64
        reference ops (resnet_native.reference), which every op function hands NumPy arrays to."""
        return self.place(placements.host(dtype))

    def place(self, where) -> "Module":
        """Put every parameter and buffer of the tree on Placement `where` (once: placing the tree where it is does
        nothing; a tree placed elsewhere raises RuntimeError)."""
        if self.placement == where:
            return self
        modules = [m for _, m in self.named_modules()]
        others = [m.placement for m in modules if m.placement not in (None, where)]
        others += [p.placement for p in self.parameters() if p.placement not in (None, where)]
        if others:
            raise RuntimeError(f"place: {type(self).__name__} is already on {others[0]}, not {where}: build a new "
                               "model (or load this one's state_dict into one) to have it there")
        params = [p for p in self.parameters() if p.arena is None]
        if params:
            ParameterArena(params, where, low_dtype=self._low_precision_dtype())
        for m in modules:
            if m.placement is None:
                m._buffers.xp = where.xp
                m._place_own_state(where)
                m.placement = where
        return self

    def ensure_placed(self):
        """The tree's Placement, placing it on the GPU first when it has none (what a first forward does)."""
        if self.placement is None:
            self.cuda()
        return self.placement

    def _low_precision_dtype(self):
        """dtype of the low-precision parameter copies the ops of this tree read (None: they read the
        masters)."""
        own = self._own_low_precision_dtype()
        if own is not None:
            return own
        for child in self._children.values():
            found = child._low_precision_dtype()
            if found is not None:
                return found
        return None

    def _own_low_precision_dtype(self):
        return None

    def _place_own_state(self, where) -> None:
        """Move non-parameter state (e.g. batch-norm running statistics) to Placement `where`."""

    def forget_saved(self) -> None:
        """Drop what the last training forward saved for backward (tree-wide)."""
        for _, m in self.named_modules():
            m._forget_own_saved()

    def _forget_own_saved(self) -> None:
        pass

    # -- state -----------------------------------------------------------------------------------------------
    def _state_items(self):
        """[(local name, torch shape, numpy dtype)] of this module's own state, in torchvision order."""
        return [(n, self._torch_shape(n, p), np.float32) for n, p in self._params.items()]

    def _torch_shape(self, name, param) -> tuple:
        return param.shape

    def _to_torch(self, name, array) -> np.ndarray:
        """A parameter-shaped host array in torch's layout (conv weights of NHWC layers differ)."""
        return array

    def _from_torch(self, name, array) -> np.ndarray:
        return array

    def _state_source(self, name) -> tuple:
        """(array, to_host) of one state entry: the live array where it is kept (device or host, not copied)
        and the function that turns a host copy of it into its state_dict value."""
        return self._params[name].data, lambda a: np.ascontiguousarray(self._to_torch(name, np.asarray(a, np.float32)))

    def _write_state(self, name, value) -> None:
        self._params[name].assign(self._from_torch(name, value))

    def state_sources(self) -> dict:
        """{torchvision name: (array, to_host)} of every parameter and buffer, uncopied: what state_dict() copies,
        for callers that copy to the host themselves (the trainer's asynchronous checkpoint snapshot)."""
        return {p + n: m._state_source(n) for p, m in self.named_modules() for n, _, _ in m._state_items()}

    def state_dict(self) -> dict:
        """{torchvision name: NumPy array} of every parameter and buffer (conv weights as (K, C, R, S))."""
        return {k: to_host(placements.host_copy(a)) for k, (a, to_host) in self.state_sources().items()}

    def grads_dict(self) -> dict:
        """{torchvision name: NumPy array} of every parameter's gradient, in torch layout (for tests and
        debugging)."""
        out = {}
        for prefix, m in self.named_modules():
            for name, param in m._params.items():
                if param.grad is None:
                    raise RuntimeError(f"{prefix}{name}: no gradient yet (the model is not placed: cuda() / to_host())")
                grad = np.asarray(placements.host_copy(param.grad), np.float32)
                out[prefix + name] = np.ascontiguousarray(m._to_torch(name, grad))
        return out

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Load arrays named and shaped as state_dict() gives them (e.g. from a torchvision model or an .npz).

        strict: every key must match (KeyError listing missing and unexpected keys); else only matching keys
        load. Values may be NumPy arrays, anything np.asarray accepts, or device arrays. Shapes must match
        (ValueError).
        """
        entries = {p + n: (m, n, shape) for p, m in self.named_modules() for n, shape, _ in m._state_items()}
        keys = list(state.keys())
        missing = [k for k in entries if k not in state]
        unexpected = [k for k in keys if k not in entries]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        values = {}
        for key in keys:
            if key not in entries:
                continue
            value = state[key]
            if hasattr(value, "__cuda_array_interface__") and hasattr(value, "get"):
                value = value.get()
            elif hasattr(value, "detach"):  # a torch tensor
                value = value.detach().cpu().numpy()
            value = np.asarray(value)
            shape = tuple(entries[key][2])
            if tuple(value.shape) != shape:
                raise ValueError(f"load_state_dict: {key}: expected shape {shape}, got {tuple(value.shape)}")
            values[key] = value
        for key, value in values.items():
            module, name, _ = entries[key]
            module._write_state(name, value)

    # -- description -----------------------------------------------------------------------------------------
    def describe(self) -> str:
        """One line of configuration for the layer table (empty for containers)."""
        return ""

    def __repr__(self):
        return f"{type(self).__name__}({self.describe()})"
