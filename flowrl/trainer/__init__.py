"""The trainer: the only part of flowrl that touches accelerate."""
from flowrl.trainer.trainer import Trainer, format_report

__all__ = ["Trainer", "format_report"]
