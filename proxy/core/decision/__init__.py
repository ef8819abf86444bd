"""Hit, half-hit or miss as an ordered list of pure stages; change detection; answer validation."""
