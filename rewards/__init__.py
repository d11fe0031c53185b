"""How samples are judged: reward sources return one float or None (abstain) per sample."""
