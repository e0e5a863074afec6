"""Shared fixtures: one torch thread (2-core machines; also makes timings and sums stable)."""

import torch

torch.set_num_threads(1)
