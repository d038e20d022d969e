"""The spatial + non-spatial Q-network: one Q-value per function (no-op, select army,
move) and per screen cell, Q(move to x, y) = action_head[move] + spatial[y, x]."""

from __future__ import annotations

import torch
from torch import nn

from train.workloads.envs.spec import MINIMAP_LAYERS, SCREEN_LAYERS, ObsSpec


class QNetwork(nn.Module):
    scale: torch.Tensor

    def __init__(self, spec: ObsSpec, trunk: int = 32, hidden: int = 128) -> None:
        super().__init__()
        in_ch = spec.screen_channels + spec.minimap_channels
        scales = [1.0 / s for _, s in SCREEN_LAYERS] + [1.0 / s for _, s in MINIMAP_LAYERS]
        self.register_buffer("scale", torch.tensor(scales).view(1, in_ch, 1, 1),
                             persistent=False)
        self.trunk = nn.Sequential(
            nn.Conv2d(in_ch, 16, 5, padding=2), nn.ReLU(),
            nn.Conv2d(16, trunk, 3, padding=1), nn.ReLU(),
        )
        self.spatial_head = nn.Conv2d(trunk, 1, 1)
        self.nonspatial = nn.Sequential(nn.Linear(spec.nonspatial_dim, 64), nn.ReLU())
        self.fc = nn.Sequential(nn.Linear(trunk + 64, hidden), nn.ReLU())
        self.action_head = nn.Linear(hidden, 3)

    def forward(self, screen: torch.Tensor, minimap: torch.Tensor,
                nonspatial: torch.Tensor) -> torch.Tensor:
        x = torch.cat([screen, minimap], dim=1).to(self.scale.dtype) * self.scale
        features = self.trunk(x)
        spatial = self.spatial_head(features).flatten(1)
        pooled = features.amax(dim=(2, 3))
        hidden = self.fc(torch.cat([pooled, self.nonspatial(nonspatial)], dim=1))
        functions = self.action_head(hidden)
        return torch.cat([functions[:, :2], functions[:, 2:3] + spatial], dim=1)


def action_mask(available: torch.Tensor, res: int) -> torch.Tensor:
    """(B, 3) available functions -> (B, 2 + res*res) mask over flat actions."""
    return torch.cat([available[:, :2], available[:, 2:3].expand(-1, res * res)], dim=1)
