"""Train one config: loading and checking configs, the model, the steps, the loop (no records)."""
