"""The credit core (docs/design.md#the-credit-core): the trainer over GRPOTrainer that owns every TRL override,
the per-row record of a generation batch, the part registry, and what every method shares (group
advantages, success, collectives, logs). It imports no method package.
"""
