"""metrics.jsonl (one JSON object per optimizer step) and optional tensorboard."""
from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, Optional


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class MetricsLogger:
    def __init__(self, output_dir: str, tensorboard: bool = True):
        self.path = os.path.join(output_dir, "metrics.jsonl")
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(os.path.join(output_dir, "tb"))
            except ImportError:  # tensorboard is optional
                self.tb = None

    def truncate_after(self, step: int) -> None:
        """Drop rows with ``step`` > step (written after the checkpoint a run resumes from)."""
        if not os.path.isfile(self.path):
            return
        rows = [line for line in open(self.path) if line.strip() and json.loads(line).get("step", 0) <= step]
        tmp = self.path + ".tmp"
        with open(tmp, "w") as fh:
            fh.writelines(rows)
        os.replace(tmp, self.path)

    def log(self, row: Dict[str, Any]) -> None:
        with open(self.path, "a") as fh:
            fh.write(json.dumps({k: _clean(v) for k, v in row.items()}, sort_keys=True) + "\n")
        if self.tb is not None:
            step = int(row["step"])
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self.tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def read_metrics(output_dir: str) -> list[Dict[str, Optional[float]]]:
    path = os.path.join(output_dir, "metrics.jsonl")
    return [json.loads(line) for line in open(path) if line.strip()]
