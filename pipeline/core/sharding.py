"""Hand-made splits of per-item work: shard `index` of `count` (round-robin by position)."""

from __future__ import annotations


def shard_of(df, cfg):
    """Rows of `df` that belong to this shard (round-robin by position)."""
    count, index = int(cfg.shard.count), int(cfg.shard.index)
    if not 0 <= index < count:
        raise ValueError(f"shard.index={index} must be in [0, shard.count={count})")
    return df.iloc[index::count] if count > 1 else df
