"""The evaluation of the live service's decision log: off-policy estimates of the served model and
alternatives (`rofu evaluate`); it reads the service's database and checkpoints."""
