"""Per-epoch training metrics: a CSV always, TensorBoard event files when `tensorboard` imports, a PNG of the curves.

The CSV is rewritten whole (atomically) each epoch from the in-memory history, so after --resume it holds exactly
the epochs of the checkpoint plus the new ones, never a row from an epoch that was lost in a crash.
TensorBoard is written with the tensorboard package's own event writer and protobufs (no torch import).
The plot uses matplotlib when it imports, else a plain PIL line drawing.
tensorboard and matplotlib are optional (the extra `logging`); when one is missing where it would have been used,
that is said once per process on stderr.
"""

from __future__ import annotations

import csv
import io
import math
import pathlib
import sys
import threading
import time

from .._core.files import atomic_write_bytes, atomic_write_text

COLUMNS = ("epoch", "lr", "train_loss", "train_acc", "test_loss", "test_acc", "epoch_time_s", "images_per_s")
# A run with test-time augmentation adds these (the mean logits' loss and accuracy, the GPU seconds of the mirrored
# pass); a run without it keeps the columns above alone.
TTA_COLUMNS = ("test_loss_tta", "test_acc_tta", "tta_s")
# A run with progressive resizing adds the side of each epoch's training images.
SIZE_COLUMN = "image_size"


_SAID = set()  # the optional packages whose absence has been reported


def note_missing(package: str, error: Exception, consequence: str) -> None:
    """Say once per process, on stderr, that an optional package did not import and what is done instead."""
    if package in _SAID:
        return
    _SAID.add(package)
    why = "is not installed" if isinstance(error, ImportError) else f"failed to import ({error})"
    print(f"{package} {why}: pip install 'resnet_native[logging]'; {consequence}", file=sys.stderr)


def _tensorboard_writer(logdir):
    """(writer, make_event) from the tensorboard package, or None when it does not import."""
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except Exception as e:  # not installed, or a broken install: TensorBoard output is optional
        note_missing("tensorboard", e, "writing metrics.csv only")
        return None
    writer = EventFileWriter(str(logdir))

    def make_event(step, values):
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=k, simple_value=float(v))
                                             for k, v in values.items()])
        return event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary)

    return writer, make_event


class MetricsLog:
    """log_epoch(row) appends one epoch's metrics; rows: the history so far (e.g. from a checkpoint on resume)."""

    def __init__(self, out_dir, *, rows=None, tensorboard: bool = True):
        self.out_dir = pathlib.Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.out_dir / "metrics.csv"
        self.rows = [dict(r) for r in (rows or [])]
        # The event writer is made at first use: tensorboard's import is slow, and the trainer's first log runs
        # while the GPU is an epoch ahead, not before its first step.
        self._tb_wanted, self._tb = tensorboard, None
        if self.rows:
            self._write_csv()

    def _tensorboard(self):
        if self._tb_wanted:
            self._tb_wanted = False
            self._tb = _tensorboard_writer(self.out_dir / "tensorboard")
        return self._tb

    @property
    def tensorboard_enabled(self) -> bool:
        return self._tensorboard() is not None

    def _write_csv(self):
        buf = io.StringIO()
        columns = COLUMNS + (TTA_COLUMNS if any(TTA_COLUMNS[1] in r for r in self.rows) else ())
        columns += (SIZE_COLUMN,) if any(SIZE_COLUMN in r for r in self.rows) else ()
        w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for r in self.rows:
            w.writerow({k: r.get(k, "") for k in columns})
        atomic_write_text(self.csv_path, buf.getvalue())

    def log_epoch(self, row: dict) -> None:
        self.rows.append(dict(row))
        self._write_csv()
        if self._tensorboard() is not None:
            writer, make_event = self._tb
            scalars = {
                "loss/train": row.get("train_loss"), "loss/test": row.get("test_loss"),
                "accuracy/train": row.get("train_acc"), "accuracy/test": row.get("test_acc"),
                "accuracy/test_tta": row.get("test_acc_tta"),
                "lr": row.get("lr"), "throughput/images_per_s": row.get("images_per_s"),
            }
            writer.add_event(make_event(row["epoch"], {k: v for k, v in scalars.items() if v is not None}))
            writer.flush()

    def close(self) -> None:
        self._tb_wanted = False
        if self._tb is not None:
            self._tb[0].close()
            self._tb = None


def read_metrics_csv(path) -> list[dict]:
    """Rows of a metrics.csv with numbers parsed (epoch and image size as int, the rest as float)."""
    with open(path, newline="") as f:
        rows = []
        for r in csv.DictReader(f):
            rows.append({k: (int(v) if k in ("epoch", SIZE_COLUMN) else float(v)) if v not in ("", None) else None
                         for k, v in r.items()})
    return rows


# ----------------------------------------------------------------------------------------------------------------
# Plot


_PRELOAD = []  # the thread of preload_plotting(), once started


def preload_plotting() -> None:
    """Import matplotlib (its Agg backend and pyplot) on a daemon thread, once, so that plot_curves at the end of
    a run only draws. A failed import is left for plot_curves to meet and report."""
    if _PRELOAD:
        return

    def load():
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot  # noqa: F401
        except Exception:
            pass

    _PRELOAD.append(threading.Thread(target=load, name="matplotlib-preload", daemon=True))
    _PRELOAD[0].start()


def plot_curves(rows, path, title: str = "") -> str:
    """Loss and accuracy (train and test) against epoch, as a PNG. Returns the backend used."""
    path = pathlib.Path(path)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # not installed, or a broken install: Pillow draws the curves instead
        note_missing("matplotlib", e, f"drawing {path.name} with Pillow")
        _plot_with_pil(rows, path, title)
        return "pil"
    epochs = [r["epoch"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, metric, label in ((axes[0], "loss", "loss"), (axes[1], "acc", "accuracy")):
        for split, style in (("train", "-"), ("test", "--")):
            ax.plot(epochs, [r.get(f"{split}_{metric}") for r in rows], style, label=split)
        ax.set_xlabel("epoch")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(path, lambda f: f.write(buf.getvalue()))
    return "matplotlib"


_COLORS = {"train": (31, 119, 180), "test": (255, 127, 14)}


def _plot_with_pil(rows, path, title):
    from PIL import Image, ImageDraw

    panel_w, panel_h, margin = 480, 320, 50
    img = Image.new("RGB", (2 * panel_w, panel_h + 30), "white")
    draw = ImageDraw.Draw(img)
    if title:
        draw.text((10, 5), title, fill="black")
    epochs = [r["epoch"] for r in rows]
    for p, (metric, label) in enumerate((("loss", "loss"), ("acc", "accuracy"))):
        x0, y0 = p * panel_w + margin, 30 + 10
        x1, y1 = (p + 1) * panel_w - 15, 30 + panel_h - margin
        series = {s: [r.get(f"{s}_{metric}") for r in rows] for s in ("train", "test")}
        values = [v for vs in series.values() for v in vs if v is not None and math.isfinite(v)]
        lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
        if hi - lo < 1e-12:
            lo, hi = lo - 0.5, hi + 0.5
        e_lo, e_hi = (min(epochs), max(epochs)) if epochs else (0, 1)
        e_span = max(e_hi - e_lo, 1)
        draw.rectangle([x0, y0, x1, y1], outline="black")
        draw.text((x0, y1 + 8), f"epoch {e_lo}", fill="black")
        draw.text((x1 - 60, y1 + 8), f"epoch {e_hi}", fill="black")
        draw.text((x0 + 4, y0 + 2), f"{label}  max {hi:.4g}", fill="black")
        draw.text((x0 + 4, y1 - 14), f"min {lo:.4g}", fill="black")

        def xy(e, v, x0=x0, y0=y0, x1=x1, y1=y1, lo=lo, hi=hi, e_lo=e_lo, e_span=e_span):
            return (x0 + (e - e_lo) / e_span * (x1 - x0), y1 - (v - lo) / (hi - lo) * (y1 - y0))

        for i, (split, vs) in enumerate(series.items()):
            pts = [xy(e, v) for e, v in zip(epochs, vs, strict=True) if v is not None and math.isfinite(v)]
            if len(pts) > 1:
                draw.line(pts, fill=_COLORS[split], width=2)
            for x, y in pts:
                draw.ellipse([x - 2, y - 2, x + 2, y + 2], fill=_COLORS[split])
            draw.text((x1 - 60, y0 + 4 + 14 * i), split, fill=_COLORS[split])
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    atomic_write_bytes(path, lambda f: f.write(buf.getvalue()))
