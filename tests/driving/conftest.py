"""Driving tests: one CPU thread, small scenes."""
import torch

torch.set_num_threads(1)
