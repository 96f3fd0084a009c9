"""Hand-made splits of per-item work: shard `index` of `count` (round-robin by position)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class Shard:
    index: int = 0
    count: int = 1

    def __post_init__(self):
        if not 0 <= self.index < self.count:
            raise ValueError(f"shard.index={self.index} must be in [0, shard.count={self.count})")

    def of(self, df: pd.DataFrame, by: str | None = None) -> pd.DataFrame:
        """Rows of `df` in this shard: round-robin by position, or by the order of first
        appearance of the values of column `by` (all rows of one value stay together)."""
        if self.count <= 1:
            return df
        if by is None:
            return df.iloc[self.index::self.count]
        mine = df[by].drop_duplicates().iloc[self.index::self.count]
        return df[df[by].isin(set(mine))]
