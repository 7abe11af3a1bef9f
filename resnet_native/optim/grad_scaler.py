"""Dynamic loss scaling for fp16 training, entirely on the device (no host synchronisation per step).

Per step (TrainStep does this): the loss gradient is multiplied by `scale` (a device array); after backward,
multi_tensor.check_finite sets found_inf when any gradient is inf/nan; the optimizer's fused kernel multiplies
the gradients by 1/scale as it reads them (no separate pass; unscale_() does one, for callers that need the
true gradients first, e.g. to clip them) and skips the whole update when found_inf is set; then update()
halves the scale on inf/nan, or doubles it after `growth_interval` consecutive good steps (PyTorch's GradScaler
rule), in one native kernel launch (update_scale below is the same rule as array ops, for a scaler on the host).
bf16 needs no scaling (use scaler=None).

Its arrays live where the model does: TrainStep places the scaler with its model, a scaler first used with an
optimizer follows the optimizer's parameters, and one used alone goes to the GPU (cuda() / to_host() say so).
"""

import numpy as np

from .._core import placement as placements
from .._core.names import finite_number, flag, whole_number
from ..ops import multi_tensor


def update_scale(
    xp, scale, growth_tracker, found_inf, *, growth_factor, backoff_factor, growth_interval, scratch
):
    """The scale update as array ops on shape-(1,) arrays (NumPy for a scaler on the host), all in place:

        if found_inf:  scale *= backoff_factor;  tracker = 0
        else:          tracker += 1;  if tracker >= growth_interval: scale *= growth_factor;  tracker = 0

    scratch: dict with 'good', 'grow', 'both' (bool) and 'factor', 'term' (scale's dtype) arrays of shape
    (1,).
    """
    good, grow, both = scratch["good"], scratch["grow"], scratch["both"]
    factor, term = scratch["factor"], scratch["term"]
    xp.equal(found_inf, 0, out=good)
    xp.add(growth_tracker, 1, out=growth_tracker)
    xp.multiply(growth_tracker, good, out=growth_tracker)  # reset on inf/nan
    xp.greater_equal(growth_tracker, growth_interval, out=grow)
    xp.logical_and(good, grow, out=both)
    xp.logical_not(grow, out=grow)
    xp.multiply(growth_tracker, grow, out=growth_tracker)  # reset after growing
    # factor = backoff + good * (1 - backoff) + (good and grow) * (growth - 1): backoff, 1 or growth.
    xp.multiply(good, 1.0 - backoff_factor, out=factor)
    xp.add(factor, backoff_factor, out=factor)
    xp.multiply(both, growth_factor - 1.0, out=term)
    xp.add(factor, term, out=factor)
    xp.multiply(scale, factor, out=scale)


class GradScaler:
    def __init__(
        self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, enabled=True
    ):
        init_scale = finite_number("init_scale", init_scale)
        growth_factor = finite_number("growth_factor", growth_factor)
        backoff_factor = finite_number("backoff_factor", backoff_factor)
        if not init_scale > 0:
            raise ValueError(f"init_scale: expected > 0, got {init_scale!r}")
        if not growth_factor > 1.0:
            raise ValueError(f"growth_factor: expected > 1, got {growth_factor!r}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"backoff_factor: expected a float in (0, 1), got {backoff_factor!r}")
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = whole_number("growth_interval", growth_interval, 1)
        self.enabled = flag("enabled", enabled)
        self._host_scale = float(init_scale)  # the state until the device arrays exist
        self._host_tracker = 0
        self.placement = None  # where its arrays live, once chosen
        self._dev = None
        self._unscaled = False

    def place(self, where) -> "GradScaler":
        """Keep the scale and its scratch on Placement `where` (that of the model it serves; once)."""
        if self.placement is not None and self.placement != where:
            raise RuntimeError(f"GradScaler: already on {self.placement}, not {where}")
        self.placement = where
        return self

    def cuda(self) -> "GradScaler":
        return self.place(placements.gpu())

    def to_host(self, dtype=np.float64) -> "GradScaler":
        return self.place(placements.host(dtype))

    def _device(self, where=None):
        """The scaler's arrays, created on first use on its placement (else `where`, else the GPU)."""
        if self._dev is None:
            if self.placement is None:
                self.place(where if where is not None else placements.gpu())
            placed = self.placement
            xp, f32 = placed.xp, placed.master_dtype
            self._dev = {  # uploaded, not filled: no runtime-compiled fill kernel on the GPU
                "scale": placed.array([self._host_scale], f32),
                "inv_scale": xp.empty((1,), dtype=f32),
                "found_inf": xp.zeros((1,), dtype=np.int32),
                "tracker": placed.array([self._host_tracker], np.int32),
            }
            if xp is np:  # update_scale's scratch (on the GPU the update is one kernel and needs none)
                self._dev.update({name: np.empty((1,), dtype=np.bool_) for name in ("good", "grow", "both")})
                self._dev.update({name: np.empty((1,), dtype=f32) for name in ("factor", "term")})
        return self._dev

    @property
    def scale_array(self):
        """The current scale as a device array of shape (1,) (multiply the loss gradient by it)."""
        return self._device()["scale"]

    @property
    def found_inf(self):
        """Device int32 array of shape (1,): nonzero when the last unscale_ found an inf/nan gradient."""
        return self._device()["found_inf"]

    def scale_(self, grad) -> None:
        """grad *= scale in place (grad: the loss gradient, e.g. d(loss)/d(logits))."""
        if self.enabled:
            scale = self.scale_array
            self.placement.xp.multiply(grad, scale, out=grad)

    def unscale_(self, optimizer) -> None:
        """Check every gradient for inf/nan (into found_inf) and divide them by the scale, once per step."""
        if not self.enabled or self._unscaled:
            return
        optimizer.unscale_grads(self._check_gradients(optimizer))
        self._unscaled = True

    def _check_gradients(self, optimizer):
        """found_inf = any gradient inf/nan; inv_scale = 1/scale; returns inv_scale (device (1,) arrays)."""
        grad_lists = optimizer.grad_lists()
        dev = self._device(optimizer.placement)
        dev["found_inf"].fill(0)
        for grads in grad_lists:
            multi_tensor.check_finite(grads, dev["found_inf"])
        if self.placement.xp is np:
            np.reciprocal(dev["scale"], out=dev["inv_scale"])
        else:
            multi_tensor.reciprocal_scale(dev["scale"], dev["inv_scale"])
        return dev["inv_scale"]

    def step(self, optimizer) -> None:
        """optimizer.prepare_step(), then launch_step(optimizer)."""
        optimizer.prepare_step()
        self.launch_step(optimizer)

    def launch_step(self, optimizer) -> None:
        """The device half of step(): check the gradients for inf/nan and launch the optimizer's update with
        1/scale fused in (or on the gradients unscale_() already divided), skipped on the device when found_inf
        is set. Allocates nothing and never synchronises: it can be captured in a CUDA graph."""
        if not self.enabled:
            optimizer.launch_step()
            return
        if self._unscaled:
            optimizer.launch_step(found_inf=self.found_inf)
            return
        inv_scale = self._check_gradients(optimizer)
        optimizer.launch_step(found_inf=self.found_inf, inv_scale=inv_scale)

    def update(self) -> None:
        """Adjust the scale from this step's found_inf (on the device)."""
        if not self.enabled:
            return
        dev = self._device()
        if self.placement.xp is np:
            update_scale(np, dev["scale"], dev["tracker"], dev["found_inf"], growth_factor=self.growth_factor,
                         backoff_factor=self.backoff_factor, growth_interval=self.growth_interval, scratch=dev)
        else:  # one native kernel launch (the same rule)
            multi_tensor.update_loss_scale(dev["scale"], dev["tracker"], dev["found_inf"], self.growth_factor,
                                           self.backoff_factor, self.growth_interval)
        self._unscaled = False

    def get_scale(self) -> float:
        """The current scale (reads the device: synchronises; for logging, not per step)."""
        if self._dev is None:
            return self._host_scale
        return float(placements.host_copy(self._dev["scale"])[0])

    def state_header(self) -> dict:
        """The settings in state_dict(): what lives on the host."""
        return {"growth_factor": self.growth_factor, "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval, "enabled": self.enabled}

    def state_sources(self) -> dict:
        """{'scale', 'growth_tracker': (array, to_host)}: the device arrays, uncopied (host values before they
        exist), for callers that copy to the host themselves (the trainer's checkpoint snapshot)."""
        if self._dev is None:  # the dtypes the device arrays will have
            dtype = self.placement.master_dtype if self.placement is not None else np.float32
            scale, tracker = np.full((1,), self._host_scale, dtype), np.full((1,), self._host_tracker, np.int32)
        else:
            scale, tracker = self._dev["scale"], self._dev["tracker"]
        return {"scale": (scale, _first_float), "growth_tracker": (tracker, _first_int)}

    def state_dict(self) -> dict:
        out = {k: to_host(placements.host_copy(a)) for k, (a, to_host) in self.state_sources().items()}
        return {**out, **self.state_header()}

    def load_state_dict(self, state: dict) -> None:
        self.growth_factor = float(state.get("growth_factor", self.growth_factor))
        self.backoff_factor = float(state.get("backoff_factor", self.backoff_factor))
        self.growth_interval = int(state.get("growth_interval", self.growth_interval))
        self.enabled = bool(state.get("enabled", self.enabled))
        self._host_scale = float(state["scale"])
        self._host_tracker = int(state.get("growth_tracker", 0))
        if self._dev is not None:
            # Written into the arrays a captured step reads, so it continues from the loaded scale (the factors
            # and interval it was captured with stay in its graph until TrainStep.reset_graphs()).
            self._dev["scale"].fill(self._host_scale)
            self._dev["tracker"].fill(self._host_tracker)
            self._dev["found_inf"].fill(0)
        self._unscaled = False

    def __repr__(self):
        return (
            f"GradScaler(scale={self.get_scale():g}, growth_factor={self.growth_factor:g}, "
            f"backoff_factor={self.backoff_factor:g}, growth_interval={self.growth_interval}, "
            f"enabled={self.enabled})"
        )


def _first_float(a) -> float:
    return float(a[0])


def _first_int(a) -> int:
    return int(a[0])
